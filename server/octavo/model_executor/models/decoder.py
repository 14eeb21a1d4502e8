"""One decoder layer, built from a ``LayerSpec`` out of the shared blocks.

The residual stream travels beside ``hidden`` so each norm that follows an add can fuse
it (vLLM's layout): a layer takes ``(hidden, residual)`` and returns the pair whose sum
is its output. The three norm layouts (pre, sandwich, post) are the only branches.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from octavo.model_executor.layers.attention import Attention
from octavo.model_executor.models.layer_spec import (
    POST_NORM,
    PRE_NORM,
    SANDWICH_NORM,
    LayerSpec,
    make_norm,
)


class DecoderLayer(nn.Module):
    def __init__(self, hidden_size: int, spec: LayerSpec, method) -> None:
        super().__init__()
        self.spec = spec
        self.is_state_layer = spec.state_block is not None
        if spec.state_block is not None:
            self.self_attn = spec.state_block()
        elif spec.attention_block is not None:
            self.self_attn = spec.attention_block()
        else:
            self.self_attn = Attention(
                hidden_size, spec.attention, spec.norm_kind, spec.norm_eps, method
            )
        self.mlp = spec.mlp()
        norm = functools.partial(make_norm, spec.norm_kind, hidden_size, spec.norm_eps)
        layout = spec.norm_layout
        self.input_layernorm = None if layout == POST_NORM else norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm() if layout == SANDWICH_NORM else None
        self.post_feedforward_layernorm = None if layout == PRE_NORM else norm()

    @property
    def num_kv_heads(self) -> int:
        return self.self_attn.num_kv_heads

    def forward(self, hidden, residual, rope, kv_cache, meta, attention):
        """Returns the new ``(hidden, residual)``."""
        layout = self.spec.norm_layout
        if layout == POST_NORM:
            return self._post_norm(hidden, residual, rope, kv_cache, meta, attention)
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self._scaled(self._mix(hidden, rope, kv_cache, meta, attention))
        if layout == SANDWICH_NORM:
            hidden = self.post_attention_layernorm(hidden)
            hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
            return self._scaled(self.post_feedforward_layernorm(self.mlp(hidden))), residual
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self._scaled(self.mlp(hidden)), residual

    def _post_norm(self, hidden, residual, rope, kv_cache, meta, attention):
        """OLMo 2: each block's output is normed, then added to the stream."""
        if residual is not None:
            hidden = hidden + residual
        attended = self._mix(hidden, rope, kv_cache, meta, attention)
        hidden = hidden + self.post_attention_layernorm(attended)
        return self.post_feedforward_layernorm(self.mlp(hidden)), hidden

    def _mix(self, hidden, rope, kv_cache, meta, attention):
        """Attention over the paged KV cache, or a state layer's mixer over its state
        tensors (``kv_cache`` is then the layer's tuple of them)."""
        if self.is_state_layer:
            return self.self_attn(hidden, kv_cache, meta)
        return self.self_attn(hidden, rope, kv_cache, meta, attention)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        multiplier = self.spec.residual_multiplier
        return x if multiplier == 1.0 else x * multiplier
