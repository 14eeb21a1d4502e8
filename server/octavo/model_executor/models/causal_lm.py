"""The decoder-only transformer every architecture is: embedding, decoder layers, final
norm and LM head over a paged KV cache. An architecture file subclasses ``CausalLM`` and
overrides the hooks (``attention_spec``, ``make_mlp``, ``layer_spec``, ...) that differ.

Tokens of one step arrive flattened (no padding): ``input_ids [T]``, ``positions [T]``.
Only the rows named by ``logits_indices`` reach the LM head. The linear layers, the
embedding and the LM head come from ``layers/`` and hold this process's tensor-parallel
shard. With pipeline parallelism a process builds only its stage: its slice of the
layers, the embedding on the first stage, the final norm and LM head on the last; a stage
that is not first takes the previous stage's ``IntermediateTensors``, one that is not
last returns its own instead of logits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from octavo.attention.backend import AttentionBackend
from octavo.attention.metadata import AttentionMetadata
from octavo.distributed.parallel_state import pipeline_stage
from octavo.distributed.pipeline_comm import IntermediateTensors
from octavo.kv_cache.state_slots import StateSpec
from octavo.model_executor.image_embeds import ImageEmbeds
from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.mlp import GatedMLP
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
from octavo.model_executor.model_config import FULL_ATTENTION, ModelConfig
from octavo.model_executor.models.decoder import DecoderLayer
from octavo.model_executor.models.layer_spec import AttentionSpec, LayerSpec, make_norm
from octavo.model_executor.rotary import RotaryEmbedding
from octavo.pooling.dense_modules import load_dense_layers
from octavo.pooling.params import PoolerConfig


class CausalLM(nn.Module):
    # The config.json ``architectures`` names this class serves, declared by the class
    # itself (not inherited; ``registry.MANIFEST`` lists them per module, checked by a test).
    architectures: ClassVar[tuple[str, ...]] = ()
    # Checkpoints of the same decoder saved without the LM head (e5-mistral's MistralModel,
    # gte-Qwen2's Qwen2Model): served by this class for pooling.
    pooling_architectures: ClassVar[tuple[str, ...]] = ()
    # Takes images (has ``embed_images``; prompts go through the folder's HF processor).
    takes_images: ClassVar[bool] = False
    # A bidirectional encoder (``encoder.EncoderModel``): pooling only, whole prompts.
    is_encoder: ClassVar[bool] = False
    # The decoder's linears LoRA can wrap -> the PEFT module names each fuses, in order.
    lora_modules: ClassVar[dict[str, tuple[str, ...]]] = {
        "self_attn.qkv": ("q_proj", "k_proj", "v_proj"),
        "self_attn.o_proj": ("o_proj",),
        "mlp.gate_up": ("gate_proj", "up_proj"),
        "mlp.down_proj": ("down_proj",),
    }
    # HF modules the checkpoint stores fused (Phi-3's ``qkv_proj``) -> the fused linear the
    # loader splits them into; none by default (Q/K/V and gate/up come one by one).
    stored_fused_modules: ClassVar[dict[str, str]] = {}
    norm_kind = "rms"
    # ``layer_types`` whose layers are state layers (LFM2's "conv"): ``make_state_mixer``
    # builds their mixers, which keep a state slot per sequence instead of KV blocks.
    state_layer_types: ClassVar[frozenset[str]] = frozenset()
    # a sentence-transformers folder's Dense modules (``load_derived_weights``); not
    # submodules: they stay fp32 whatever the model's dtype
    dense_layers: tuple[nn.Module, ...] = ()

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__()
        self.config, self.quantization = config, quantization
        self.stage = pipeline_stage()
        self.first_layer, last_layer = self.stage.layer_range(config.num_layers)
        self.embed_tokens = self.norm = self.lm_head = None
        if self.stage.is_first:
            quantized = quantization in QUANTIZED_EMBEDDING
            embedding = QuantizedVocabEmbedding if quantized else VocabParallelEmbedding
            self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        method = functools.partial(linear_method_for, quantization)  # one per linear
        self.layers = nn.ModuleList(
            DecoderLayer(config.hidden_size, self.layer_spec(index), method)
            for index in range(self.first_layer, last_layer)
        )
        if self.stage.is_last:
            self.norm = make_norm(self.norm_kind, config.hidden_size, config.rms_norm_eps)
        if self.stage.is_last and not config.pooling_only:  # a pooling model has no LM head
            self.lm_head = ParallelLMHead(
                config.vocab_size, config.hidden_size, lm_head_method_for(quantization)
            )
        self.tie_lm_head()
        self.rotary: dict[str, RotaryEmbedding] = {}  # set once dtype and device are known
        self.requires_grad_(False)

    # --- hooks an architecture overrides -------------------------------------------------

    def layer_spec(self, index: int) -> LayerSpec:
        state_block = None
        if self.is_state_layer(index):
            state_block = functools.partial(self.make_state_mixer, index)
        return LayerSpec(
            attention=self.attention_spec(index),
            mlp=functools.partial(self.make_mlp, index),
            norm_eps=self.config.rms_norm_eps,
            norm_kind=self.norm_kind,
            state_block=state_block,
        )

    @classmethod
    def pooler_defaults(cls, config: ModelConfig) -> PoolerConfig | None:
        """The architecture's pooling defaults (None: last token, normalised, unless the
        folder's sentence-transformers modules say otherwise)."""
        return None

    def make_state_mixer(self, index: int) -> nn.Module:
        """A state layer's mixer (``state_spec()``, ``forward(hidden, state, meta)``)."""
        raise NotImplementedError(f"{type(self).__name__} has no state layers")

    @classmethod
    def has_state_layers(cls, config: ModelConfig) -> bool:
        return any(kind in cls.state_layer_types for kind in config.layer_types)

    def is_state_layer(self, index: int) -> bool:
        return self.config.layer_types[index] in self.state_layer_types

    def state_specs(self) -> list[StateSpec | None]:
        """Per layer of this stage: its state tensors' spec, None for an attention layer."""
        return [
            layer.self_attn.state_spec() if layer.is_state_layer else None for layer in self.layers
        ]

    def attention_spec(self, index: int) -> AttentionSpec:
        config = self.config
        return AttentionSpec(
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            qkv_bias=config.attention_bias,
            o_bias=self.o_proj_bias(),
            sliding_window=config.window_of(index),
        )

    def o_proj_bias(self) -> bool:
        """Llama-style configs' ``attention_bias`` covers the output projection too."""
        return bool(getattr(self.config.hf, "attention_bias", False))

    def make_mlp(self, index: int) -> nn.Module:
        method = functools.partial(linear_method_for, self.quantization)
        bias = bool(getattr(self.config.hf, "mlp_bias", False))
        return GatedMLP(
            self.config.hidden_size, self.config.intermediate_size, SiluAndMul(), method, bias
        )

    def rope_parameters(self) -> dict[str, dict]:
        """Rope settings by the name layers refer to them (``AttentionSpec.rope``)."""
        return {FULL_ATTENTION: self.config.rope}

    def scale_embeddings(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        """A checkpoint tensor's name in Llama's naming (``None``: not used)."""
        return name

    def extra_weight_keys(self) -> set[str]:
        """Tensors outside the decoder the checkpoint must fill (a vision tower's)."""
        return set()

    def load_derived_weights(self, folder: Path) -> None:
        """Weights beside the checkpoint: a sentence-transformers folder's Dense modules,
        which ``pooling_head`` applies to pooled vectors."""
        device = next(self.parameters()).device
        self.dense_layers = tuple(load_dense_layers(folder, device))

    def pooling_head(self, pooled: torch.Tensor) -> torch.Tensor:
        """The head on pooled vectors ``[n, hidden]``: the Dense modules, if any (fp32)."""
        for layer in self.dense_layers:
            pooled = layer(pooled.float())
        return pooled

    # --- the forward pass ------------------------------------------------------------------

    def set_rotary(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rotary = {
            name: RotaryEmbedding(self.config.head_dim, max_positions, rope, dtype, device)
            for name, rope in self.rope_parameters().items()
        }

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
        result = self.run(
            input_ids, positions, kv_caches, meta, attention, logits_indices, None, intermediate
        )
        return result if isinstance(result, IntermediateTensors) else result.logits

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        attention: AttentionBackend,
        logits_indices: torch.Tensor,
        pooled_indices: torch.Tensor | None = None,
        intermediate: IntermediateTensors | None = None,
        image_embeds: ImageEmbeds | None = None,
    ) -> StepResult | IntermediateTensors:
        """``forward``, and on the last stage also the final (normed) hidden states of the
        ``pooled_indices`` rows: what pooling requests are made of. ``image_embeds``: image
        features that replace the embeddings of the placeholder rows they name."""
        hidden, residual = self.hidden_states(
            input_ids, positions, kv_caches, meta, attention, intermediate, image_embeds
        )
        if not self.stage.is_last:
            return IntermediateTensors(hidden, residual)
        return self.final(hidden, residual, logits_indices, pooled_indices)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        attention: AttentionBackend,
        intermediate: IntermediateTensors | None = None,
        image_embeds: ImageEmbeds | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The embeddings (or the previous stage's activations) through this stage's
        layers: the hidden states and the residual not yet added to them."""
        assert self.rotary, "set_rotary before running the model"
        ropes = {name: table.for_step(positions) for name, table in self.rotary.items()}
        if intermediate is None:
            hidden, residual = self.embed(input_ids, image_embeds), None
        else:
            hidden, residual = intermediate.hidden, intermediate.residual
        metas = meta.layer_metas or [meta] * len(self.layers)  # KV cache groups: their own
        for layer, kv_cache, layer_meta in zip(self.layers, kv_caches, metas, strict=True):
            rope = ropes.get(layer.spec.attention.rope)
            hidden, residual = layer(hidden, residual, rope, kv_cache, layer_meta, attention)
        return hidden, residual

    def embed(self, input_ids: torch.Tensor, image_embeds: ImageEmbeds | None) -> torch.Tensor:
        """The tokens' (scaled) embeddings, image placeholders replaced by their features."""
        hidden = self.scale_embeddings(self.embed_tokens(input_ids))
        if image_embeds is not None:
            hidden[image_embeds.rows] = image_embeds.features.to(hidden.dtype)
        return hidden

    def final(self, hidden, residual, logits_indices, pooled_indices) -> StepResult:
        """The final norm of the ``logits_indices`` rows (and ``pooled_indices``), their logits."""
        rows = logits_indices
        if pooled_indices is not None:
            rows = torch.cat([logits_indices, pooled_indices])
        normed, _ = self.norm(hidden[rows], residual[rows])
        num_logits = logits_indices.numel()
        pooled = None if pooled_indices is None else normed[num_logits:]
        if self.lm_head is None:
            return StepResult(None, pooled)
        logits = self.lm_head(normed[:num_logits])
        return StepResult(None if logits is None else self.scale_logits(logits.float()), pooled)


@dataclass
class StepResult:
    """The last stage's output: logits of the sampled rows (None on tensor ranks other
    than 0, and on a pooling model) and final hidden states of the pooled rows."""

    logits: torch.Tensor | None
    pooled_hidden: torch.Tensor | None = None
