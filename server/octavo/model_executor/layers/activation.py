"""Gated activations over the fused gate/up projection: ``act(gate) · up``.

Every module takes ``x [tokens, 2d]`` holding gate then up (a loader de-interleaves
checkpoints that interleave them, as gpt-oss's does) and returns ``[tokens, d]``.
``activation_for`` maps a config's ``hidden_act`` to the module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.kernels.cpu_build import ops_for


def on_gpu(x: torch.Tensor) -> bool:
    """The Triton kernel's case: a CUDA tensor with unit column stride."""
    return x.is_cuda and x.dim() == 2 and x.stride(-1) == 1


def triton_gated(x: torch.Tensor, kind: str) -> torch.Tensor:
    from octavo.model_executor.layers.triton_activation import gated_activation_triton

    return gated_activation_triton(x, kind)


class _KernelGated(nn.Module):
    """A gated activation with a Triton kernel on GPU, a native one on CPU and the torch
    path (``forward_native``) elsewhere; subclasses name their kernels."""

    triton_kind = ""  # triton_activation's name
    native_op = ""  # torch.ops.octavo_cpu's name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [tokens, 2d]`` (gate, then up) → ``[tokens, d]``."""
        if on_gpu(x):
            return triton_gated(x, self.triton_kind)
        ops = ops_for(x)
        if ops is None or x.dim() != 2 or x.stride(-1) != 1:
            return self.forward_native(x)
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
        getattr(ops, self.native_op)(out, x)
        return out


class SiluAndMul(_KernelGated):
    triton_kind, native_op = "silu", "silu_and_mul"

    @staticmethod
    def forward_native(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluTanhAndMul(_KernelGated):
    """``gelu(gate, approximate="tanh") · up`` (Gemma's ``gelu_pytorch_tanh``)."""

    triton_kind, native_op = "gelu_tanh", "gelu_tanh_and_mul"

    @staticmethod
    def forward_native(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


class GeluAndMul(nn.Module):
    """``gelu(gate) · up`` with the exact (erf) GeLU, HF's ``gelu``; torch path only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate) * up


class ClampedSwigluAndMul(nn.Module):
    """gpt-oss's clamped SwiGLU: ``(clamp(up) + 1) · g · sigmoid(alpha · g)``.

    ``g = min(gate, limit)``; ``up`` is clamped to ``[-limit, limit]``.

    The operations (and so the roundings in bfloat16) follow transformers' GptOssExperts.
    """

    def __init__(self, alpha: float = 1.702, limit: float = 7.0) -> None:
        super().__init__()
        self.alpha = alpha
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if on_gpu(x) and (self.alpha, self.limit) == (1.702, 7.0):
            return triton_gated(x, "clamped_swiglu")
        return self.forward_native(x)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return (up + 1) * glu

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, limit={self.limit}"


_TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_python_tanh", "gelu_accurate")
_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "silu": SiluAndMul,
    "swish": SiluAndMul,
    "gelu": GeluAndMul,
    "gelu_python": GeluAndMul,
    **dict.fromkeys(_TANH_GELUS, GeluTanhAndMul),
}


def activation_for(hidden_act: str) -> nn.Module:
    """The gated activation for a HF config's ``hidden_act`` (``hidden_activation``).

    HF's ``gelu_new``, ``gelu_fast`` and ``gelu_accurate`` are written-out forms of the same
    tanh approximation (equal up to rounding), so they share ``GeluTanhAndMul``.
    """
    try:
        return _ACTIVATIONS[hidden_act]()
    except KeyError:
        supported = ", ".join(sorted(_ACTIVATIONS))
        raise ValueError(
            f"unsupported hidden_act {hidden_act!r}: Octavo supports {supported}"
        ) from None
