"""Gated attention (Qwen3-Next's full-attention layers): the shared ``Attention`` whose
``q_proj`` also yields a per-head output gate, as transformers' ``Qwen3NextAttention``.

``q_proj``'s rows are, head by head, the head's query then its gate (``head_dim`` each):
the fused Q/K/V projection is built for twice the heads, so a tensor-parallel rank keeps
whole (query, gate) pairs. Queries and keys are normed per head (``qk_norm="head"``) and
roped; the attention output times ``sigmoid(gate)`` goes into ``o_proj``.
"""

from __future__ import annotations

import dataclasses

import torch

from octavo.attention.backend import AttentionBackend
from octavo.attention.metadata import AttentionMetadata
from octavo.model_executor.layers.attention import Attention
from octavo.model_executor.layers.linear import RowParallelLinear
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.rotary import RotaryStep


class GatedAttention(Attention):
    def __init__(
        self, hidden_size: int, spec: AttentionSpec, norm_kind: str, eps: float, method
    ) -> None:
        if spec.qk_norm != "head" or spec.sinks:
            raise ValueError("gated attention norms each head's query and key, without sinks")
        doubled = dataclasses.replace(spec, num_heads=2 * spec.num_heads)  # query + gate
        super().__init__(hidden_size, doubled, norm_kind, eps, method)
        self.spec = spec
        self.num_heads //= 2  # this rank's attention heads
        self.o_proj = RowParallelLinear(  # the doubled spec's was twice as wide
            spec.num_heads * spec.head_dim, hidden_size, bias=spec.o_bias, method=method()
        )

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryStep | None,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        num_tokens, head_dim = x.shape[0], self.head_dim
        query_gate, key, value = self.qkv(x).split(self.split_sizes, -1)
        query, gate = query_gate.view(num_tokens, self.num_heads, 2, head_dim).unbind(2)
        query = self.q_norm(query.reshape(-1, head_dim)).view(num_tokens, -1, head_dim)
        key = self.k_norm(key.reshape(-1, head_dim)).view(num_tokens, -1, head_dim)
        value = value.view(num_tokens, -1, head_dim)
        if rope is not None:
            rope.apply_(query)
            rope.apply_(key)
        out = backend.forward(
            query, key, value, kv_cache, meta, self.scale, self.kv_scales, self.options()
        )
        gated = out.reshape(num_tokens, -1) * torch.sigmoid(gate.reshape(num_tokens, -1))
        return self.o_proj(gated)
