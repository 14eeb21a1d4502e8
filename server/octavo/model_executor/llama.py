"""Octavo's own Llama-family decoder (Llama 2/3, Qwen2, Mistral) over a paged KV cache.

Tokens of one step arrive flattened (no padding): ``input_ids [T]``, ``positions [T]``.
Q/K/V and gate/up projections are fused into single matrices at load time. Only the
rows named by ``logits_indices`` reach the LM head. The linear layers, the embedding and
the LM head come from ``layers/`` and hold this process's tensor-parallel shard.

With pipeline parallelism a process builds only its stage: its slice of the decoder
layers, the embedding on the first stage, the final norm and LM head on the last. A
stage that is not first takes the previous stage's ``IntermediateTensors``; one that
is not last returns its own instead of logits.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from octavo.attention.backend import AttentionBackend
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.distributed.parallel_state import pipeline_stage
from octavo.distributed.pipeline_comm import IntermediateTensors
from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.layernorm import RMSNorm
from octavo.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.model_executor.layers.quantization.registry import (
    QUANTIZED_EMBEDDING,
    linear_method_for,
    lm_head_method_for,
)
from octavo.model_executor.layers.vocab import (
    ParallelLMHead,
    QuantizedVocabEmbedding,
    VocabParallelEmbedding,
)
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.rotary import RotaryEmbedding, RotaryStep


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__()
        hidden, inter, head_dim = config.hidden_size, config.intermediate_size, config.head_dim
        method = functools.partial(linear_method_for, quantization)  # one per layer
        self.qkv = QKVParallelLinear(
            hidden, head_dim, config.num_heads, config.num_kv_heads,
            bias=config.attention_bias, method=method(),
        )  # fmt: skip
        self.num_heads, self.num_kv_heads = self.qkv.num_heads, self.qkv.num_kv_heads  # shard
        self.head_dim = head_dim
        self.split_sizes = [self.qkv.q_size, self.qkv.kv_size, self.qkv.kv_size]
        self.scale = head_dim**-0.5
        self.kv_scales: KVScales = UNIT_SCALES  # an fp8 KV cache's k_scale / v_scale
        self.input_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.post_attention_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.o_proj = RowParallelLinear(config.num_heads * head_dim, hidden, method=method())
        self.gate_up = MergedColumnParallelLinear(hidden, [inter, inter], method=method())
        self.down_proj = RowParallelLinear(inter, hidden, method=method())
        self.act = SiluAndMul()

    def forward(self, hidden, residual, rope: RotaryStep, kv_cache, meta, attention):
        """One layer; the residual stream travels beside ``hidden`` so each norm can fuse
        the add before it. Returns the new ``(hidden, residual)``."""
        if residual is None:
            hidden, residual = self.input_norm(hidden), hidden
        else:
            hidden, residual = self.input_norm(hidden, residual)
        hidden = self._attention(hidden, rope, kv_cache, meta, attention)
        hidden, residual = self.post_attention_norm(hidden, residual)
        return self.down_proj(self.act(self.gate_up(hidden))), residual

    def _attention(
        self, x, rope: RotaryStep, kv_cache, meta: AttentionMetadata, attention: AttentionBackend
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv(x)
        q_and_k, v = qkv.split([self.split_sizes[0] + self.split_sizes[1], self.split_sizes[2]], -1)
        q_and_k = q_and_k.view(num_tokens, -1, self.head_dim)
        rope.apply_(q_and_k)  # one rotation for the query and key heads together, in place
        q, k = q_and_k.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = attention.forward(q, k, v, kv_cache, meta, self.scale, self.kv_scales)
        return self.o_proj(out.reshape(num_tokens, -1))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.stage = pipeline_stage()
        self.first_layer, last_layer = self.stage.layer_range(config.num_layers)
        self.embed_tokens = None
        self.final_norm = self.lm_head = None
        if self.stage.is_first:
            quantized = quantization in QUANTIZED_EMBEDDING
            embedding = QuantizedVocabEmbedding if quantized else VocabParallelEmbedding
            self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, quantization) for _ in range(self.first_layer, last_layer)
        )
        if self.stage.is_last:
            self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.lm_head = ParallelLMHead(
                config.vocab_size, config.hidden_size, lm_head_method_for(quantization)
            )
        self.tie_lm_head()
        self.rotary: RotaryEmbedding | None = None  # set once dtype and device are known
        self.requires_grad_(False)

    def tie_lm_head(self) -> None:
        """Share the embedding with the LM head when both live in this stage (a quantized
        LM head keeps its own copy of the checkpoint's matrix)."""
        if (
            self.config.tie_word_embeddings
            and None not in (self.embed_tokens, self.lm_head)
            and self.lm_head.is_unquantized
        ):
            self.lm_head.tie_to(self.embed_tokens)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        attention: AttentionBackend,
        logits_indices: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors | None:
        """Logits of the ``logits_indices`` rows (last stage; ``None`` on tensor ranks other
        than 0, which do not sample), else this stage's ``IntermediateTensors``."""
        assert self.rotary is not None, "set model.rotary before running the model"
        rope = self.rotary.for_step(positions)
        if intermediate is None:
            hidden, residual = self.embed_tokens(input_ids), None
        else:
            hidden, residual = intermediate.hidden, intermediate.residual
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(hidden, residual, rope, kv_cache, meta, attention)
        if self.lm_head is None:
            return IntermediateTensors(hidden, residual)
        hidden, _ = self.final_norm(hidden[logits_indices], residual[logits_indices])
        logits = self.lm_head(hidden)
        return None if logits is None else logits.float()
