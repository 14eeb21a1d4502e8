"""Llama 4's attention: the shared ``Attention`` block (fused Q/K/V, paged backend, output
projection) with what transformers' ``Llama4TextAttention`` does between the projections
and the softmax:

* rope layers rotate adjacent pairs of each head (``(x0, x1), (x2, x3), ...``: complex
  multiplication). Their dims are de-interleaved (evens, then odds) and rotated as the
  usual halves, queries and keys alike, so every score is unchanged; the cache holds the
  keys in that order. Then, with ``use_qk_norm``, queries and keys are L2-normed over
  each head (an RMSNorm without weight, in float32). Rope layers attend within chunks
  (``AttentionSpec.chunk_size``).
* NoPE layers do not rotate; with ``attn_temperature_tuning`` their queries are scaled by
  ``1 + attn_scale * log1p(floor((pos + 1) / floor_scale))``. They receive the step's
  ``RotaryStep`` all the same: it carries the tokens' positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.attention.backend import AttentionBackend
from octavo.attention.metadata import AttentionMetadata
from octavo.model_executor.layers.attention import Attention
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.rotary import RotaryStep


@dataclass(frozen=True)
class TemperatureTuning:
    """``attn_temperature_tuning``'s query scale per position (NoPE layers)."""

    floor_scale: float
    attn_scale: float

    def scales(self, positions: torch.Tensor) -> torch.Tensor:
        """``[T]`` float32, as transformers computes them."""
        steps = torch.floor((positions.float() + 1.0) / self.floor_scale)
        return torch.log1p(steps) * self.attn_scale + 1.0


@dataclass(frozen=True)
class Llama4Choices:
    """What one layer's attention does beyond ``AttentionSpec``."""

    uses_rope: bool  # no_rope_layers[i]
    l2_qk_norm: bool  # use_qk_norm, on rope layers only
    norm_eps: float  # the L2 norm's epsilon (rms_norm_eps)
    temperature: TemperatureTuning | None  # NoPE layers with attn_temperature_tuning


class Llama4Attention(Attention):
    def __init__(
        self, hidden_size: int, spec: AttentionSpec, choices: Llama4Choices, method
    ) -> None:
        super().__init__(hidden_size, spec, "rms", choices.norm_eps, method)
        self.choices = choices

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryStep | None,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        assert rope is not None, "Llama 4 layers take the step's positions from its rope"
        q, k, v = self._projections(x)
        if self.choices.uses_rope:
            q, k = self._rotate(q, k, rope)
        elif self.choices.temperature is not None:
            scales = self.choices.temperature.scales(rope.positions)
            q = (q * scales[:, None, None]).to(q.dtype)
        out = backend.forward(q, k, v, kv_cache, meta, self.scale, self.kv_scales, self.options())
        return self.o_proj(out.reshape(x.shape[0], -1))

    def _rotate(
        self, q: torch.Tensor, k: torch.Tensor, rope: RotaryStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys de-interleaved, rotated (and L2-normed where the config says)."""
        joint = torch.cat([q, k], dim=1)  # [T, heads + kv_heads, dim]
        tokens, heads, dim = joint.shape
        joint = joint.view(tokens, heads, dim // 2, 2).transpose(-1, -2).reshape(joint.shape)
        rope.apply_(joint)
        if self.choices.l2_qk_norm:
            joint = l2_norm(joint, self.choices.norm_eps)
        q, k = joint.split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x)`` over the last dim in float32 (transformers' ``Llama4TextL2Norm``)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
