"""What this CPU can do, read once from /proc/cpuinfo (empty where it cannot be read)."""

from __future__ import annotations

from functools import cache
from pathlib import Path


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


def cpu_can_pack_bf16() -> bool:
    """oneDNN's prepacked bf16 linears need AVX-NE-CONVERT or AVX-512 BW/VL/DQ."""
    flags = cpu_flags()
    return "avx_ne_convert" in flags or {"avx512bw", "avx512vl", "avx512dq"} <= flags
