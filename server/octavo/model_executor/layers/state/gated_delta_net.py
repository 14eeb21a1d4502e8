"""Gated DeltaNet: Qwen3-Next's linear-attention mixer, as transformers'
``Qwen3NextGatedDeltaNet`` computes it, over per-sequence state slots.

* ``in_proj_qkvz`` gives, per key head, its query and key (``head_k_dim`` each) and the
  value and output gate ``z`` of the value heads it serves (``num_v_heads //
  num_k_heads`` of them); ``in_proj_ba`` gives each value head's ``b`` and ``a``;
* queries, keys and values (``[q | k | v]`` channels) go through a causal depthwise
  conv of ``linear_conv_kernel_dim`` taps with SiLU (the shared ``causal_conv1d``: its
  state is the last ``kernel - 1`` inputs);
* the gated delta rule (``gated_delta_rule``) with ``beta = sigmoid(b)`` and the log
  decay ``g = -exp(A_log) * softplus(a + dt_bias)``; its state is ``[v_heads,
  head_k_dim, head_v_dim]`` float values per sequence;
* a gated RMSNorm per value head (``norm(o) * silu(z)``), then ``out_proj``.

Under tensor parallelism whole key heads (with their value heads) are split: both input
projections are column-parallel (their rows are grouped by key head), the conv's
channels and ``A_log`` / ``dt_bias`` are this rank's heads', ``out_proj`` is row-parallel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octavo.attention.metadata import AttentionMetadata
from octavo.distributed.parallel_state import tensor_parallel_group
from octavo.kv_cache.state_slots import StateSpec
from octavo.model_executor.layers.linear import (
    ColumnParallelLinear,
    RowParallelLinear,
    copy_checked,
)
from octavo.model_executor.layers.state.causal_conv1d import causal_conv1d
from octavo.model_executor.layers.state.gated_delta_rule import gated_delta_rule, prepare_inputs


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    norm_eps: float

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def values_per_key(self) -> int:
        return self.num_v_heads // self.num_k_heads


class GatedDeltaNet(nn.Module):
    def __init__(self, hidden_size: int, spec: GatedDeltaNetSpec, method) -> None:
        super().__init__()
        self.spec = spec
        first, last = tensor_parallel_group().shard(spec.num_k_heads, "linear key heads")
        self.k_heads = last - first  # this rank's
        self.v_heads = self.k_heads * spec.values_per_key
        self.first_v_head = first * spec.values_per_key
        self.in_proj_qkvz = ColumnParallelLinear(
            hidden_size, 2 * (spec.key_dim + spec.value_dim), method=method()
        )
        self.in_proj_ba = ColumnParallelLinear(hidden_size, 2 * spec.num_v_heads, method=method())
        self.conv1d = ShardedDepthwiseConv(spec, first, self.k_heads)
        self.dt_bias = nn.Parameter(torch.empty(self.v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(self.v_heads), requires_grad=False)
        self.norm = GatedRMSNorm(spec.head_v_dim, spec.norm_eps)
        self.out_proj = RowParallelLinear(spec.value_dim, hidden_size, method=method())

    def state_spec(self) -> StateSpec:
        """The conv's last ``kernel - 1`` inputs and the delta rule's matrix per head."""
        spec = self.spec
        conv = (self.conv1d.channels, spec.conv_kernel - 1)
        return StateSpec(shapes=(conv, (self.v_heads, spec.head_k_dim, spec.head_v_dim)))

    def weight_loader(self, param: torch.Tensor, loaded, name: str) -> None:
        """``A_log`` / ``dt_bias``, one per value head in the checkpoint: this rank's."""
        copy_checked(param, loaded.narrow(0, self.first_v_head, self.v_heads), name)

    def forward(
        self, hidden: torch.Tensor, state: tuple[torch.Tensor, ...], meta: AttentionMetadata
    ) -> torch.Tensor:
        """``hidden [T, hidden]`` → ``[T, hidden]``; ``state``: (conv, recurrent) slots."""
        conv_state, recurrent_state = state
        mixed, gate, b, a = self._project(hidden)
        mixed = causal_conv1d(mixed, self.conv1d.taps(), None, conv_state, meta, "silu")
        spec, num_tokens = self.spec, hidden.shape[0]
        key_dim = self.k_heads * spec.head_k_dim
        query, key, value = mixed.split([key_dim, key_dim, self.v_heads * spec.head_v_dim], -1)
        decay = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        inputs = prepare_inputs(
            query.view(num_tokens, self.k_heads, spec.head_k_dim),
            key.view(num_tokens, self.k_heads, spec.head_k_dim),
            value.view(num_tokens, self.v_heads, spec.head_v_dim),
            decay,
            b.sigmoid(),
        )
        out = gated_delta_rule(inputs, recurrent_state, meta).to(hidden.dtype)
        out = self.norm(out.view(-1, spec.head_v_dim), gate.reshape(-1, spec.head_v_dim))
        return self.out_proj(out.view(num_tokens, -1))

    def _project(
        self, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(``[q | k | v]`` channels ``[T, conv channels]``, the gate ``z [T, v_heads,
        head_v_dim]``, ``b`` and ``a [T, v_heads]``) from the per-key-head layouts."""
        spec, num_tokens = self.spec, hidden.shape[0]
        grouped_v = spec.values_per_key * spec.head_v_dim
        qkvz = self.in_proj_qkvz(hidden).view(num_tokens, self.k_heads, -1)
        query, key, value, gate = qkvz.split(
            [spec.head_k_dim, spec.head_k_dim, grouped_v, grouped_v], -1
        )
        flat = (x.reshape(num_tokens, -1) for x in (query, key, value))
        mixed = torch.cat(list(flat), dim=-1)
        ba = self.in_proj_ba(hidden).view(num_tokens, self.k_heads, -1)
        b, a = ba.split([spec.values_per_key, spec.values_per_key], -1)
        gate = gate.reshape(num_tokens, self.v_heads, spec.head_v_dim)
        return mixed, gate, b.reshape(num_tokens, -1), a.reshape(num_tokens, -1)


class ShardedDepthwiseConv(nn.Module):
    """``conv1d.weight [channels, 1, kernel]`` whose channels are ``[q | k | v]`` of every
    head: this rank keeps its heads' channels of each of the three."""

    def __init__(self, spec: GatedDeltaNetSpec, first_k_head: int, k_heads: int) -> None:
        super().__init__()
        key_start, key_size = first_k_head * spec.head_k_dim, k_heads * spec.head_k_dim
        value_size = k_heads * spec.values_per_key * spec.head_v_dim
        value_start = first_k_head * spec.values_per_key * spec.head_v_dim
        self.sources = (  # (first channel in the checkpoint, channels) of q, k, v
            (key_start, key_size),
            (spec.key_dim + key_start, key_size),
            (2 * spec.key_dim + value_start, value_size),
        )
        self.channels = 2 * key_size + value_size
        self.weight = nn.Parameter(
            torch.empty(self.channels, 1, spec.conv_kernel), requires_grad=False
        )

    def weight_loader(self, param: torch.Tensor, loaded, name: str) -> None:
        parts = [loaded.narrow(0, start, size) for start, size in self.sources]
        copy_checked(param, torch.cat(parts), name)

    def taps(self) -> torch.Tensor:
        """``[channels, kernel]``, as ``causal_conv1d`` takes them."""
        return self.weight[:, 0]


class GatedRMSNorm(nn.Module):
    """transformers' ``Qwen3NextRMSNormGated``: RMSNorm of each head's output (float32,
    the weight applied in the input's dtype), then times ``silu(gate)``."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * normed.to(x.dtype)
        return (out * F.silu(gate.float())).to(x.dtype)
