"""Octavo's own Llama-family decoder (Llama 2/3, Qwen2, Mistral) over a paged KV cache.

Tokens of one step arrive flattened (no padding): ``input_ids [T]``, ``positions [T]``.
Q/K/V and gate/up projections are fused into single matrices at load time. Only the
rows named by ``logits_indices`` reach the LM head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.attention.backend import AttentionBackend
from octavo.attention.metadata import AttentionMetadata
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.rotary import RotaryEmbedding, apply_rotary


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim, self.eps = config.head_dim, config.rms_norm_eps
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.scale = config.head_dim**-0.5
        hidden, inter = config.hidden_size, config.intermediate_size
        self.input_norm = nn.Parameter(torch.ones(hidden), requires_grad=False)
        self.post_attention_norm = nn.Parameter(torch.ones(hidden), requires_grad=False)
        self.qkv = nn.Linear(hidden, q_size + 2 * kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, hidden, rope, kv_cache, meta: AttentionMetadata, attention: AttentionBackend):
        normed = F.rms_norm(hidden, hidden.shape[-1:], self.input_norm, self.eps)
        hidden = hidden + self._attention(normed, rope, kv_cache, meta, attention)
        normed = F.rms_norm(hidden, hidden.shape[-1:], self.post_attention_norm, self.eps)
        gate, up = self.gate_up(normed).chunk(2, dim=-1)
        return hidden + self.down_proj(F.silu(gate) * up)

    def _attention(self, x, rope, kv_cache, meta, attention: AttentionBackend) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv(x)
        q_and_k, v = qkv.split([self.split_sizes[0] + self.split_sizes[1], self.split_sizes[2]], -1)
        cos, sin = rope  # one rotation for the query and key heads together
        q_and_k = apply_rotary(q_and_k.view(num_tokens, -1, self.head_dim), cos, sin)
        q, k = q_and_k.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = attention.forward(q, k, v, kv_cache, meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, -1))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.final_norm = nn.Parameter(torch.ones(config.hidden_size), requires_grad=False)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary: RotaryEmbedding | None = None  # set once dtype and device are known
        self.requires_grad_(False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        attention: AttentionBackend,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        assert self.rotary is not None, "set model.rotary before running the model"
        rope = self.rotary.tables(positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, rope, kv_cache, meta, attention)
        hidden = hidden[logits_indices]
        hidden = F.rms_norm(hidden, hidden.shape[-1:], self.final_norm, self.config.rms_norm_eps)
        return self.lm_head(hidden).float()
