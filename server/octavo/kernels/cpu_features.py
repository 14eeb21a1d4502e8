"""What this CPU can do: its flags, read once from /proc/cpuinfo (empty where it cannot
be read), and what torch's oneDNN itself reports it can run here."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import torch


@cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(text.split())


def cpu_has_native_bf16() -> bool:
    """bf16 arithmetic in hardware (AVX-512-BF16 or AMX): bf16 is the fast dtype here."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_has_int8_dot() -> bool:
    """int8 products in hardware (AVX-512 VNNI, AVX-VNNI or AMX): oneDNN's int8 GEMM
    (``torch._int_mm``) is fast here; without them it ran 23-28x slower than fp32."""
    return any(flag in cpu_flags() for flag in INT8_DOT_FLAGS)


@cache
def onednn_supports_bf16() -> bool:
    """torch's own answer: oneDNN runs bf16 kernels (prepacked bf16 linears) on this CPU.

    oneDNN needs AVX-NE-CONVERT or AVX-512 BW/VL/DQ, as it sees the CPU: with
    ``ONEDNN_MAX_CPU_ISA=AVX2`` it says no even on an AVX-512 machine, which
    ``/proc/cpuinfo`` cannot know. Asked once per process.
    """
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the query: assume not
        return False


PREPACK_ENV = "OCTAVO_CPU_PREPACK"


def prepack_enabled() -> bool:
    """Linear weights are prepacked (fp32 into the native kernels' panels, bf16 into
    oneDNN's layout) unless ``OCTAVO_CPU_PREPACK=0`` (kept for side-by-side measurements
    and as an escape hatch)."""
    return os.environ.get(PREPACK_ENV, "1") != "0"


DENSE_ENV = "OCTAVO_CPU_DENSE"


def dense_kernel_enabled() -> bool:
    """fp32 linears run on the native panel kernel (``dense_linear``) unless
    ``OCTAVO_CPU_DENSE=0``, which prepacks them for oneDNN instead (A/B measurements)."""
    return os.environ.get(DENSE_ENV, "1") != "0"
