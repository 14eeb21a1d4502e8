"""The attention block of a decoder layer: fused Q/K/V projection, optional Q/K norms,
rotary embedding, the paged attention backend (with the layer's window / soft-cap / sinks)
and the output projection. Every architecture's attention is this module with options."""

from __future__ import annotations

import torch
from torch import nn

from octavo.attention.backend import AttentionBackend
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import AttentionOptions
from octavo.distributed.parallel_state import tensor_parallel_group
from octavo.model_executor.layers.linear import (
    QKVParallelLinear,
    RowParallelLinear,
    copy_checked,
)
from octavo.model_executor.models.layer_spec import AttentionSpec, make_norm
from octavo.model_executor.rotary import RotaryStep


class Attention(nn.Module):
    def __init__(
        self, hidden_size: int, spec: AttentionSpec, norm_kind: str, eps: float, method
    ) -> None:
        super().__init__()
        self.spec = spec
        self.qkv = QKVParallelLinear(
            hidden_size,
            spec.head_dim,
            spec.num_heads,
            spec.num_kv_heads,
            bias=spec.qkv_bias,
            method=method(),
        )
        self.num_heads, self.num_kv_heads = self.qkv.num_heads, self.qkv.num_kv_heads  # shard
        self.head_dim = spec.head_dim
        self.split_sizes = [self.qkv.q_size, self.qkv.kv_size, self.qkv.kv_size]
        self.scale = spec.head_dim**-0.5 if spec.scale is None else spec.scale
        self.kv_scales: KVScales = UNIT_SCALES  # an fp8 KV cache's k_scale / v_scale
        self.o_proj = RowParallelLinear(
            spec.num_heads * spec.head_dim, hidden_size, bias=spec.o_bias, method=method()
        )
        self.q_norm = self.k_norm = None
        if spec.qk_norm == "head":
            self.q_norm = make_norm(norm_kind, spec.head_dim, eps)
            self.k_norm = make_norm(norm_kind, spec.head_dim, eps)
        elif spec.qk_norm == "full":
            self.q_norm = ShardedRMSNorm(self.qkv.q_size, spec.num_heads * spec.head_dim, eps)
            self.k_norm = ShardedRMSNorm(self.qkv.kv_size, spec.num_kv_heads * spec.head_dim, eps)
        self.sinks = None
        if spec.sinks:
            self.sinks = nn.Parameter(torch.empty(self.num_heads), requires_grad=False)

    def weight_loader(self, param: torch.Tensor, loaded, name: str) -> None:
        """``sinks``, one per query head in the checkpoint: this rank's heads."""
        if param is not self.sinks:
            raise ValueError(f"{name}: attention has no checkpoint tensor of that name")
        first_head = self.qkv.sources["q"][0] // self.head_dim
        copy_checked(param, loaded.narrow(0, first_head, self.num_heads), name)

    def options(self) -> AttentionOptions:
        sinks = None if self.sinks is None else self.sinks.float()
        spec = self.spec
        return AttentionOptions(spec.sliding_window, spec.soft_cap, sinks, spec.chunk_size)

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryStep | None,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self._projections(x)
        if rope is not None:
            if q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr():
                rope.apply_(self._joint_view(q, k))  # one in-place rotation for both
            else:
                rope.apply_(q)
                rope.apply_(k)
        out = backend.forward(q, k, v, kv_cache, meta, self.scale, self.kv_scales, self.options())
        return self.o_proj(out.reshape(num_tokens, -1))

    def _projections(self, x: torch.Tensor):
        """``q [T, heads, dim]``, ``k``/``v [T, kv_heads, dim]``; normed where the spec says."""
        num_tokens = x.shape[0]
        q, k, v = self.qkv(x).split(self.split_sizes, -1)
        if self.spec.qk_norm == "full":
            q, k = self.q_norm(q.contiguous()), self.k_norm(k.contiguous())
        shape = (num_tokens, -1, self.head_dim)
        q, k, v = q.view(shape), k.view(shape), v.view(shape)
        if self.spec.qk_norm == "head":
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(shape)
        return q, k, v

    def _joint_view(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Q and K heads as one ``[T, heads + kv_heads, dim]`` view of the fused output."""
        return q.as_strided(
            (q.shape[0], self.num_heads + self.num_kv_heads, self.head_dim), q.stride()
        )


class ShardedRMSNorm(nn.Module):
    """RMSNorm over a whole projection whose features are split across tensor-parallel
    ranks (OLMo 2's Q/K norm): the mean square is summed over the ranks."""

    def __init__(self, shard_size: int, full_size: int, eps: float) -> None:
        super().__init__()
        self.tp = tensor_parallel_group()
        self.start = self.tp.shard(full_size, "normed features")[0]
        self.weight = nn.Parameter(torch.ones(shard_size), requires_grad=False)
        self.full_size, self.eps = full_size, eps

    def weight_loader(self, param: torch.Tensor, loaded, name: str) -> None:
        from octavo.model_executor.layers.linear import copy_checked

        copy_checked(param, loaded.narrow(0, self.start, param.shape[0]), name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        square_sum = self.tp.all_reduce(x32.pow(2).sum(-1, keepdim=True))
        normed = x32 * torch.rsqrt(square_sum / self.full_size + self.eps)
        return (self.weight * normed).to(x.dtype)  # as transformers' Olmo2RMSNorm
