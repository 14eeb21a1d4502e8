"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2), as transformers'
``DeepseekV2Attention`` / ``DeepseekV3Attention`` compute it, over the paged latent cache.

* queries: ``q_proj``, or the low-rank ``q_b_proj(q_a_layernorm(q_a_proj(x)))``; each head's
  ``qk_nope_head_dim`` unrotated dims, then ``qk_rope_head_dim`` rotated ones;
* keys and values: ``kv_a_proj_with_mqa(x)`` gives the latent ``c_kv`` (``kv_lora_rank``,
  normed by ``kv_a_layernorm``) and one roped key ``k_pe`` shared by every head: the cache
  keeps exactly these (``attention/mla_ops``), ``kv_lora_rank + qk_rope_head_dim`` values
  per token; ``kv_b_proj`` expands ``c_kv`` into each head's ``k_nope`` and value;
* prefill expands the chunk's context, decode uses the absorbed projections (``W_UK``,
  ``W_UV``: the per-head blocks of ``kv_b_proj``'s matrix, kept unquantized and unpacked);
* DeepSeek's rope pairs adjacent dims (``(x0, x1), (x2, x3), ...``; V3's
  ``rope_interleave``): those dims are de-interleaved, then rotated as the usual halves;
  queries and keys alike, so every score is unchanged.

Under tensor parallelism the heads are split (``q_proj``/``q_b_proj``, ``kv_b_proj``
column-parallel, ``o_proj`` row-parallel); the latent projections and the cache are whole
on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from octavo.attention import mla_ops
from octavo.attention.backend import AttentionBackend
from octavo.attention.metadata import AttentionMetadata
from octavo.distributed.parallel_state import tensor_parallel_group
from octavo.model_executor.layers.layernorm import RMSNorm
from octavo.model_executor.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    RowParallelLinear,
    copy_checked,
)
from octavo.model_executor.rotary import RotaryStep

LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with the default


@dataclass(frozen=True)
class MLASpec:
    num_heads: int
    q_lora_rank: int | None  # None: one full-rank q_proj (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    scale: float  # softmax scale (``rotary.mla_softmax_scale``)
    rope_interleaved: bool
    bias: bool = False  # attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


class ReplicatedLinear(LinearBase):
    """The whole matrix on every rank (the latent projections)."""

    def weight_loader(self, param: torch.Tensor, loaded, name: str) -> None:
        copy_checked(param, loaded, name)


class LatentUpProjection(ColumnParallelLinear):
    """``kv_b_proj``: this rank's heads' ``[k_nope; v]`` rows. Its matrix stays plain (not
    prepacked): the absorbed decode reads each head's blocks of it."""

    def __init__(self, rank: int, num_heads: int, nope_dim: int, v_dim: int) -> None:
        super().__init__(rank, num_heads * (nope_dim + v_dim))
        self.nope_dim = nope_dim
        self.num_heads = self.output_size // (nope_dim + v_dim)  # this rank's

    def process_weights_after_loading(self) -> None:
        pass

    def absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK [heads, nope_dim, rank]`` and ``W_UV [heads, v_dim, rank]`` (views)."""
        rank = self.weight.shape[1]
        per_head = self.weight.view(self.num_heads, -1, rank)
        return per_head[:, : self.nope_dim], per_head[:, self.nope_dim :]


class MLAAttention(nn.Module):
    def __init__(self, hidden_size: int, spec: MLASpec, method) -> None:
        super().__init__()
        self.spec = spec
        first, last = tensor_parallel_group().shard(spec.num_heads, "attention heads")
        self.num_heads, self.num_kv_heads = last - first, 1  # one latent "head" cached
        q_out = spec.num_heads * spec.qk_head_dim
        self.q_full_proj = self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        if spec.q_lora_rank is None:
            self.q_full_proj = ColumnParallelLinear(hidden_size, q_out, method=method())
        else:
            self.q_a_proj = ReplicatedLinear(hidden_size, spec.q_lora_rank, spec.bias, method())
            self.q_a_layernorm = RMSNorm(spec.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(spec.q_lora_rank, q_out, method=method())
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden_size, spec.latent_dim, spec.bias, method()
        )
        self.kv_a_layernorm = RMSNorm(spec.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = LatentUpProjection(
            spec.kv_lora_rank, spec.num_heads, spec.qk_nope_head_dim, spec.v_head_dim
        )
        self.o_proj = RowParallelLinear(
            spec.num_heads * spec.v_head_dim, hidden_size, bias=spec.bias, method=method()
        )

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryStep | None,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """``x [T, hidden]`` → ``[T, hidden]``; ``backend`` is unused (MLA has its own)."""
        assert rope is not None, "multi-head latent attention always rotates"
        q_nope, q_pe, entries = self._project(x, rope)
        mla_ops.store_latents(entries, kv_cache, meta.slot_mapping)
        outputs = [
            self._prefill(index, q_nope, q_pe, entries, kv_cache, meta)
            for index in range(meta.num_prefills)
        ]
        if meta.num_decodes:
            first = meta.num_prefill_tokens
            outputs.append(self._decode(q_nope[first:], q_pe[first:], kv_cache, meta))
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        return self.o_proj(out.reshape(x.shape[0], -1))

    def _project(self, x: torch.Tensor, rope: RotaryStep):
        """``q_nope [T, heads, nope]``, roped ``q_pe [T, heads, rope]`` and the cache entries
        ``[T, latent_dim]`` (normed ``c_kv``, roped ``k_pe``)."""
        spec, num_tokens = self.spec, x.shape[0]
        if self.q_full_proj is not None:
            q = self.q_full_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(num_tokens, self.num_heads, spec.qk_head_dim)
        q_nope, q_pe = q.split([spec.qk_nope_head_dim, spec.qk_rope_head_dim], -1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split(
            [spec.kv_lora_rank, spec.qk_rope_head_dim], -1
        )
        latent = self.kv_a_layernorm(latent.contiguous())
        joint = torch.cat([q_pe, k_pe[:, None]], dim=1)  # [T, heads + 1, rope]
        if spec.rope_interleaved:
            joint = torch.cat([joint[..., 0::2], joint[..., 1::2]], dim=-1)
        rope.apply_(joint)
        entries = torch.cat([latent, joint[:, -1]], dim=-1)
        return q_nope, joint[:, :-1], entries

    def _prefill(self, index, q_nope, q_pe, entries, kv_cache, meta) -> torch.Tensor:
        """One prefill chunk over its cached prefix and itself, with expanded keys/values."""
        spec = self.spec
        start = meta.query_start_loc_list[index]
        end = start + meta.query_lens_list[index]
        seq_len = meta.seq_lens_list[index]
        if end - start == seq_len:  # no cached prefix: the fresh entries, as stored
            context = mla_ops.as_stored(entries[start:end], kv_cache.dtype)
        else:
            table = meta.block_tables[index]
            context = mla_ops.gather_latents(kv_cache, table, seq_len, entries.dtype)
        latent, k_pe = context.split([spec.kv_lora_rank, spec.qk_rope_head_dim], -1)
        expanded = self.kv_b_proj(latent.contiguous()).view(seq_len, self.num_heads, -1)
        k_nope, values = expanded.split([spec.qk_nope_head_dim, spec.v_head_dim], -1)
        shared = k_pe[:, None].expand(seq_len, self.num_heads, spec.qk_rope_head_dim)
        keys = torch.cat([k_nope, shared], dim=-1)
        query = torch.cat([q_nope[start:end], q_pe[start:end]], dim=-1)
        return mla_ops.expanded_attention(query, keys, values, spec.scale)

    def _decode(self, q_nope, q_pe, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """The decoding sequences' tokens with the absorbed projections."""
        plan = meta.backend_cache.get("mla_decode_plan")
        if plan is None:  # the same for every MLA layer: derive once per step
            first = meta.num_prefills
            width = max(meta.seq_lens_list[first:])
            plan = mla_ops.decode_plan(
                meta.block_tables[first:],
                meta.seq_lens[first:],
                kv_cache.shape[2],
                width,
                q_nope.dtype,
            )
            meta.backend_cache["mla_decode_plan"] = plan
        w_uk, w_uv = self.kv_b_proj.absorbed()
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [B, heads, rank]
        query = torch.cat([q_latent, q_pe], dim=-1)
        slots, mask = plan
        latent_out = mla_ops.absorbed_decode(
            query, kv_cache, slots, mask, self.spec.scale, self.spec.kv_lora_rank
        )
        return torch.bmm(latent_out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
