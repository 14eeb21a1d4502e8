"""What one decoder layer is made of: the choices an architecture file makes.

A model file turns its config into one ``LayerSpec`` per layer; ``decoder.DecoderLayer``
builds the layer from it out of the shared blocks (``layers/``). Nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

PRE_NORM = "pre"  # Llama: norm before attention and before the MLP
SANDWICH_NORM = "sandwich"  # Gemma 2/3: also a norm after each, before the residual add
POST_NORM = "post"  # OLMo 2: only after each, before the residual add


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    # "head": an RMSNorm over each head's query/key (Qwen 3, Gemma 3); "full": one over the
    # whole query/key projection (OLMo 2); None: none.
    qk_norm: str | None = None
    scale: float | None = None  # softmax scale; None: head_dim ** -0.5
    rope: str | None = "full_attention"  # which of the model's rope tables; None: no rope
    sliding_window: int | None = None
    soft_cap: float | None = None
    sinks: bool = False  # gpt-oss: a learned per-head logit in every softmax
    chunk_size: int | None = None  # Llama 4: chunked local attention (``AttentionOptions``)


@dataclass(frozen=True)
class LayerSpec:
    attention: AttentionSpec
    # Builds the feed-forward block (a GatedMLP or a FusedMoE) for one layer.
    mlp: Callable[[], nn.Module]
    norm_eps: float = 1e-6
    norm_kind: str = "rms"  # "rms" or "gemma" (weight applied as 1 + w)
    norm_layout: str = PRE_NORM
    residual_multiplier: float = 1.0  # Granite scales each block's output
    # Builds an attention block of the layer's own (multi-head latent attention); None: the
    # shared ``Attention`` made from ``attention``. Same call as ``Attention.forward``.
    attention_block: Callable[[], nn.Module] | None = None
    # Builds the state mixer of a state layer (LFM2's short convolution, Mamba2, gated
    # DeltaNet), used in attention's place: ``forward(hidden, state, meta)`` with the
    # layer's state tensors (``kv_cache.state_slots``); None: an attention layer.
    state_block: Callable[[], nn.Module] | None = None
    extras: dict = field(default_factory=dict)


def make_norm(kind: str, size: int, eps: float) -> nn.Module:
    from octavo.model_executor.layers.layernorm import RMSNorm

    if kind == "rms":
        return RMSNorm(size, eps)
    if kind == "gemma":
        from octavo.model_executor.layers.layernorm import GemmaRMSNorm

        return GemmaRMSNorm(size, eps)
    raise ValueError(f"unknown norm kind {kind!r}")
