"""torch.compile (inductor) of the decoder layers, split at attention (vLLM's piecewise
scheme): each layer's pre-attention piece (norm, Q/K/V projection, rotary) and its
post-attention piece (output projection, residual add + norm, MLP) are compiled with a
dynamic token dimension; the paged attention backend runs eagerly between them.

Whether it runs (``compile_decision``): never on GPU here (CUDA graphs cover decode there),
never with ``--enforce-eager`` or ``-O0``; on CPU when ``--compilation-config`` says
``{"backend": "inductor"}`` or, without a backend, when ``CPU_COMPILES_BY_DEFAULT`` says so.
``OCTAVO_COMPILE=0`` / ``1`` overrides the default and the backend (tests switch it off).
Inductor's artefacts are cached under ``$OCTAVO_CACHE/torch_compile_cache``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from octavo.cache_dirs import cache_root

logger = logging.getLogger(__name__)

COMPILE_ENV = "OCTAVO_COMPILE"  # "0": never compile; "1": compile wherever allowed
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
# Measured on a 2-core AMD EPYC (AVX-512 + bf16), SmolLM2-135M bf16, 32 x 64 offline:
# see README "torch.compile on CPU". Compile stays opt-in until it pays there.
CPU_COMPILES_BY_DEFAULT = False
# The native CPU kernels a decoder layer calls: their outputs are written in place, so
# tracing needs only to know they return nothing.
LAYER_NATIVE_OPS = (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "gelu_tanh_and_mul",
    "rotary_embedding",
)


@dataclass(frozen=True)
class CompileDecision:
    enabled: bool
    reason: str  # why (logged at start-up)


def compile_decision(
    device_type: str, level: int, backend: str | None, enforce_eager: bool = False
) -> CompileDecision:
    """Whether the model's layers are compiled on this device with these settings."""
    if device_type != "cpu":
        return CompileDecision(False, f"{device_type}: decode steps run as CUDA graphs")
    if enforce_eager or level == 0:
        return CompileDecision(False, "--enforce-eager" if enforce_eager else "level 0")
    forced = os.environ.get(COMPILE_ENV, "").strip().lower()
    if forced in ("0", "false", "no", "off"):
        return CompileDecision(False, f"{COMPILE_ENV}={forced}")
    if forced in ("1", "true", "yes", "on"):
        return CompileDecision(True, f"{COMPILE_ENV}={forced}")
    if backend is not None:
        return CompileDecision(backend == "inductor", f"backend {backend}")
    return CompileDecision(CPU_COMPILES_BY_DEFAULT, "the CPU default")


def compile_cache_dir() -> Path:
    """Inductor's cache (compiled kernels, FX graphs) under Octavo's cache root; an
    explicit ``TORCHINDUCTOR_CACHE_DIR`` is kept."""
    configured = os.environ.get(INDUCTOR_CACHE_ENV)
    if configured:
        return Path(configured)
    folder = cache_root() / "torch_compile_cache"
    os.environ[INDUCTOR_CACHE_ENV] = str(folder)
    return folder


class EagerAttention:
    """The attention backend behind a dynamo boundary (the split point): its ``forward``
    runs eagerly between two compiled pieces; everything else is the backend's."""

    def __init__(self, backend) -> None:
        self.backend = backend

    @torch.compiler.disable
    def forward(self, *args):
        return self.backend.forward(*args)

    def __getattr__(self, name: str):
        return getattr(self.backend, name)


class CompiledLayers:
    """Each decoder layer's ``forward`` compiled once (the layers share one code object,
    so the pieces compile once and serve every layer); attention stays eager."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.split: dict[int, EagerAttention] = {}
        for layer in layers:
            layer.forward = self._wrap(layer)

    def _wrap(self, layer: nn.Module):
        compiled = torch.compile(layer.forward, dynamic=True)

        def forward(hidden, residual, rope, kv_cache, meta, attention):
            return compiled(hidden, residual, rope, kv_cache, meta, self._eager(attention))

        return forward

    def _eager(self, backend) -> EagerAttention:
        split = self.split.get(id(backend))
        if split is None:
            split = self.split[id(backend)] = EagerAttention(backend)
        return split


def register_fake_native_ops() -> None:
    """Tell the tracer the native layer ops write in place and return nothing."""
    namespace = torch.ops.octavo_cpu
    for name in LAYER_NATIVE_OPS:
        qualified = f"octavo_cpu::{name}"
        if not hasattr(namespace, name) or _has_fake(qualified):
            continue
        torch.library.register_fake(qualified, _returns_nothing)


def _has_fake(qualified: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "Meta")


def _returns_nothing(*args, **kwargs) -> None:
    return None


def compile_layers(model: nn.Module) -> CompiledLayers:
    """Compile ``model.layers`` in place (lazily: inductor runs at the first steps)."""
    folder = compile_cache_dir()
    register_fake_native_ops()
    logger.info("compiling the decoder layers with inductor (cache %s)", folder)
    return CompiledLayers(model.layers)


def timed_warmup(run_step) -> float:
    """Seconds ``run_step`` takes (the compile, on a first step); logged."""
    start = time.perf_counter()
    run_step()
    seconds = time.perf_counter() - start
    logger.info("torch.compile: first compiled step took %.1f s", seconds)
    return seconds
