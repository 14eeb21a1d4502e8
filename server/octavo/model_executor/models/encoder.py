"""Bidirectional encoders (the BERT family): every token of a prompt attends to every
other, the whole prompt is computed in one step and nothing is generated.

The engine runs them as it runs pooling requests on a decoder, with three differences
the engine reads from ``is_encoder``: the scheduler never splits a prompt over two steps,
the runner marks each prompt chunk as one bidirectional span (``AttentionMetadata``), and
prefix caching is off (a token's keys depend on the tokens after it). The KV cache blocks
a prompt takes are freed when it finishes. Embeddings are word + absolute position +
token type, then a LayerNorm; each layer is post-norm: ``norm(x + attention(x))``, then
``norm(x + mlp(x))`` with a plain (not gated) MLP. A ``...ForSequenceClassification``
class adds its head on the pooled vector (``pooling_head``): the class logits.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
from torch import nn

from octavo.distributed.parallel_state import pipeline_stage
from octavo.model_executor.layers.attention import Attention
from octavo.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.layers.vocab import VocabParallelEmbedding
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.causal_lm import CausalLM, StepResult
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.pooling.params import PoolerConfig, PoolingType

ACTIVATIONS = {
    "gelu": functools.partial(nn.GELU),
    "gelu_new": functools.partial(nn.GELU, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(nn.GELU, approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
}


def activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


class EncoderMLP(nn.Module):
    """``fc2(act(fc1(x)))`` with biases (BERT's intermediate and output dense layers)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: nn.Module, method) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(hidden_size, intermediate_size, bias=True, method=method())
        self.fc2 = RowParallelLinear(intermediate_size, hidden_size, bias=True, method=method())
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    """Post-norm: ``h = norm(x + attention(x))``, then ``norm(h + mlp(h))``."""

    is_state_layer = False

    def __init__(self, config: ModelConfig, spec: AttentionSpec, eps: float, method) -> None:
        super().__init__()
        size = config.hidden_size
        self.self_attn = Attention(size, spec, "rms", eps, method)
        self.attention_norm = nn.LayerNorm(size, eps=eps)
        act = activation(getattr(config.hf, "hidden_act", "gelu"))
        self.mlp = EncoderMLP(size, config.intermediate_size, act, method)
        self.output_norm = nn.LayerNorm(size, eps=eps)

    @property
    def num_kv_heads(self) -> int:
        return self.self_attn.num_kv_heads

    def forward(self, hidden, rope, kv_cache, meta, attention) -> torch.Tensor:
        attended = self.self_attn(hidden, rope, kv_cache, meta, attention)
        hidden = self.attention_norm(hidden + attended)
        return self.output_norm(hidden + self.mlp(hidden))


class EncoderModel(CausalLM):
    """The encoder and its embeddings; ``run`` returns the pooled rows' final hidden
    states (no LM head). Subclasses name the checkpoint's tensors (``checkpoint_name``)."""

    is_encoder: ClassVar[bool] = True
    classifies: ClassVar[bool] = False  # a ...ForSequenceClassification: logits per label
    lora_modules: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        nn.Module.__init__(self)
        self.config, self.quantization = config, quantization
        self.stage = pipeline_stage()
        if not (self.stage.is_first and self.stage.is_last):
            raise ValueError(f"{config.architecture} runs without pipeline parallelism")
        self.first_layer, self.norm, self.lm_head = 0, None, None
        eps = float(getattr(config.hf, "layer_norm_eps", 1e-12))
        hf = config.hf
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.embed_positions = nn.Embedding(hf.max_position_embeddings, config.hidden_size)
        types = max(1, int(getattr(hf, "type_vocab_size", 1) or 1))
        self.embed_token_types = nn.Embedding(types, config.hidden_size)
        self.embed_norm = nn.LayerNorm(config.hidden_size, eps=eps)
        method = functools.partial(linear_method_for, quantization)
        spec = self.encoder_attention_spec()
        self.layers = nn.ModuleList(
            EncoderLayer(config, spec, eps, method) for _ in range(config.num_layers)
        )
        self.rotary = {}
        self.position_offset = self.position_offset_of(config)
        self.requires_grad_(False)

    @classmethod
    def pooler_defaults(cls, config: ModelConfig) -> PoolerConfig:
        """CLS pooling, normalised (sentence-transformers' modules.json can say otherwise);
        a classifier's vectors are its logits, not normalised."""
        if cls.classifies:
            return PoolerConfig(PoolingType.CLS, False, classifier_labels(config), classifies=True)
        return PoolerConfig(PoolingType.CLS, True, config.hidden_size)

    @classmethod
    def max_positions(cls, config: ModelConfig) -> int:
        """The longest prompt the position table holds (RoBERTa's starts at an offset)."""
        return config.max_position_embeddings - cls.position_offset_of(config)

    @classmethod
    def position_offset_of(cls, config: ModelConfig) -> int:
        return 0

    def encoder_attention_spec(self) -> AttentionSpec:
        config = self.config
        return AttentionSpec(
            num_heads=config.num_heads,
            num_kv_heads=config.num_heads,
            head_dim=config.head_dim,
            qkv_bias=True,
            o_bias=True,
            rope=None,
        )

    def set_rotary(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rotary = {}  # absolute position embeddings

    def tie_lm_head(self) -> None:
        pass  # no LM head

    def extra_weight_keys(self) -> set[str]:
        keys = {"embed_positions.weight", "embed_token_types.weight"}
        keys |= {"embed_norm.weight", "embed_norm.bias"}
        return keys | {f"{name}.{key}" for name, key in self.head_weight_keys()}

    def head_weight_keys(self) -> list[tuple[str, str]]:
        """(module, parameter) pairs of the head's tensors the checkpoint must hold."""
        return []

    def run(
        self,
        input_ids,
        positions,
        kv_caches,
        meta,
        attention,
        logits_indices,
        pooled_indices=None,
        intermediate=None,
        image_embeds=None,
        token_type_ids: torch.Tensor | None = None,
    ) -> StepResult:
        """The final hidden states of the ``pooled_indices`` rows (the only output)."""
        hidden = self.embed(input_ids, positions, token_type_ids)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, None, kv_cache, meta, attention)
        pooled = None if pooled_indices is None else hidden[pooled_indices]
        return StepResult(None, pooled)

    def embed(self, input_ids, positions, token_type_ids=None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        hidden = hidden + self.embed_positions(positions + self.position_offset)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return self.embed_norm(hidden + self.embed_token_types(token_type_ids))


def classifier_labels(config: ModelConfig) -> int:
    """The classification head's outputs (``num_labels``, or ``id2label``'s size)."""
    hf = config.hf
    labels = getattr(hf, "num_labels", None) or len(getattr(hf, "id2label", None) or {}) or 2
    return int(labels)
