"""torch.compile (inductor) of the decoder layers, split at attention (vLLM's piecewise
scheme): the pieces between two attention blocks (residual add + norm, MLP) are compiled
with a dynamic token dimension; each attention block (Q/K/V projection, rotary, paged
attention, output projection) runs eagerly between them. The block, not only the paged
attention, is the split point: its rotation in place of a strided Q/K view does not
survive functionalization, and its storage check would guard on addresses.

Whether it runs (``compile_decision``): on a GPU only as a trial with ``OCTAVO_COMPILE=1``
(CUDA graphs cover decode there; the graphs then capture the compiled pieces), never with
``--enforce-eager``, ``-O0`` or compilation mode 0; on CPU when ``--compilation-config`` says
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
FORCED_ON = ("1", "true", "yes", "on")
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
# Measured on a 2-core AMD EPYC (AVX-512 + bf16), SmolLM2-135M bf16, 32 x 64 offline, one
# thread, alternating in one process: eager 297.6, compiled 278.2 tok/s (medians of 6), so
# compile stays opt-in (README "torch.compile on CPU"); not yet measured on AVX2 / AMX.
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
class CompileSettings:
    """What decides whether the layers compile (from the engine's arguments)."""

    device_type: str
    mode: int = 3  # vLLM's compilation mode (compilation_config.mode; -O0 makes it 0): 0 never
    backend: str | None = None  # {"backend": "inductor" | "eager"}; None: the default
    enforce_eager: bool = False
    world_size: int = 1
    lora: bool = False
    quantization: str | None = None


@dataclass(frozen=True)
class CompileDecision:
    enabled: bool
    reason: str  # why (logged at start-up)


def compile_decision(settings: CompileSettings) -> CompileDecision:
    """Whether the model's layers are compiled with these settings, and why."""
    forced = os.environ.get(COMPILE_ENV, "").strip().lower()
    on_cpu = settings.device_type == "cpu"
    if not on_cpu and forced not in FORCED_ON:
        return CompileDecision(False, f"{settings.device_type}: decode steps run as CUDA graphs")
    if settings.enforce_eager or settings.mode == 0:
        reason = "--enforce-eager" if settings.enforce_eager else "compilation mode 0"
        return CompileDecision(False, reason)
    unsupported = _unsupported(settings)
    if unsupported:
        return CompileDecision(False, f"not compiled with {unsupported}")
    if forced in ("0", "false", "no", "off"):
        return CompileDecision(False, f"{COMPILE_ENV}={forced}")
    if forced in FORCED_ON:
        trial = "" if on_cpu else f" (a trial on {settings.device_type})"
        return CompileDecision(True, f"{COMPILE_ENV}={forced}{trial}")
    if settings.backend is not None:
        return CompileDecision(settings.backend == "inductor", f"backend {settings.backend}")
    return CompileDecision(CPU_COMPILES_BY_DEFAULT, "the CPU default")


def _unsupported(settings: CompileSettings) -> str:
    """What the compiled layers do not handle yet: collectives inside the MLP, LoRA's
    wrapped linears, quantized linears' native ops."""
    if settings.world_size > 1:
        return "tensor/pipeline parallelism"
    if settings.lora:
        return "LoRA"
    if settings.quantization is not None:
        return f"--quantization {settings.quantization}"
    return ""


def compile_cache_dir() -> Path:
    """Inductor's cache (compiled kernels, FX graphs) under Octavo's cache root; an
    explicit ``TORCHINDUCTOR_CACHE_DIR`` is kept."""
    configured = os.environ.get(INDUCTOR_CACHE_ENV)
    if configured:
        return Path(configured)
    folder = cache_root() / "torch_compile_cache"
    os.environ[INDUCTOR_CACHE_ENV] = str(folder)
    return folder


class CompiledLayers:
    """Each decoder layer's ``forward`` compiled, its attention block (Q/K/V projection,
    rotary, paged attention, output projection) left eager: the pieces compiled are the
    norms, residual adds and the MLP between two attention calls. The layers share one
    code object, so each piece compiles once and serves every layer."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.layers = list(layers)
        self.timer = CompileTimer()
        for index, layer in enumerate(self.layers):
            layer.self_attn.forward = torch.compiler.disable(layer.self_attn.forward)
            layer.forward = self._wrap(layer, index == 0, index == len(self.layers) - 1)

    def _wrap(self, layer: nn.Module, first: bool, last: bool):
        compiled = torch.compile(layer.forward)
        timer = self.timer

        def forward(hidden, residual, rope, kv_cache, meta, attention):
            if first:
                timer.pass_started()
            _mark_tokens_dynamic(hidden, residual)
            out = compiled(hidden, residual, rope, kv_cache, meta, attention)
            if last:
                timer.pass_ended()
            return out

        return forward

    def restore(self) -> None:
        """The layers run eagerly again (the instance attributes go)."""
        for layer in self.layers:
            del layer.forward
            del layer.self_attn.forward


class CompileTimer:
    """Seconds spent in passes through the layers that compiled new graphs (start-up and
    each new shape kind: prefill, decode, one token), logged as they happen."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.start = 0.0
        self.graphs = 0

    def pass_started(self) -> None:
        self.start, self.graphs = time.perf_counter(), _graphs_compiled()

    def pass_ended(self) -> None:
        new_graphs = _graphs_compiled() - self.graphs
        if new_graphs > 0:
            elapsed = time.perf_counter() - self.start
            self.seconds += elapsed
            logger.info(
                "torch.compile: %d new graphs in %.1f s (%.1f s in all)",
                new_graphs,
                elapsed,
                self.seconds,
            )


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _mark_tokens_dynamic(*tensors: torch.Tensor | None) -> None:
    """The token dimension is dynamic; the weights' shapes stay static (oneDNN's
    prepacked linears need them)."""
    for tensor in tensors:
        if tensor is not None:
            torch._dynamo.maybe_mark_dynamic(tensor, 0)


def call_packed_linears_as_is() -> None:
    """Inductor lowers oneDNN's prepacked linear only for weights it froze itself; the
    layers' weights are prepacked at load (``UnquantizedLinearMethod``) and passed in, so
    the op is called as it is (an extern kernel) instead."""
    from torch._inductor import lowering, mkldnn_lowerings  # noqa: F401  (registers it)

    op = torch.ops.mkldnn._linear_pointwise.default
    if lowering.lowerings.get(op) is not _PACKED_LINEAR_FALLBACK.get("handler"):
        lowering.lowerings.pop(op, None)
        lowering.make_fallback(op, warn=False)
        _PACKED_LINEAR_FALLBACK["handler"] = lowering.lowerings[op]


_PACKED_LINEAR_FALLBACK: dict[str, object] = {}


def register_fake_native_ops() -> None:
    """Tell the tracer the native layer ops write in place and return nothing."""
    namespace = torch.ops.octavo_cpu
    for name in LAYER_NATIVE_OPS:
        if hasattr(namespace, name) and name not in _FAKES_REGISTERED:
            torch.library.register_fake(f"octavo_cpu::{name}", _returns_nothing)
            _FAKES_REGISTERED.add(name)


_FAKES_REGISTERED: set[str] = set()


def _returns_nothing(*args, **kwargs) -> None:
    return None


def compile_layers(model: nn.Module) -> CompiledLayers:
    """Compile ``model.layers`` in place (lazily: inductor runs at the first steps; the
    engine's start-up steps compile the prefill and decode shapes)."""
    folder = compile_cache_dir()
    register_fake_native_ops()
    call_packed_linears_as_is()
    logger.info("compiling the decoder layers with inductor (cache %s)", folder)
    return CompiledLayers(model.layers)
