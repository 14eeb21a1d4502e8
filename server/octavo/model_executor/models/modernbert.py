"""ModernBERT (``ModernBertModel``: gte-modernbert, nomic-modernbert embeddings;
``ModernBertForSequenceClassification``: rerankers such as gte-reranker-modernbert).

An encoder like BERT (whole prompts attending both ways, ``encoder.EncoderModel``), but
built like a modern decoder: no position or token-type table, rotary positions instead
(one rope table for global layers, another for local ones), pre-norm layers with
LayerNorms that may lack a bias (``norm_bias``), a GeGLU MLP (``Wi`` holds the gate and
up halves: ``Wo(act(gate) * up)``) and a final norm. Every ``global_attn_every_n_layers``-th
layer attends globally; the others attend locally: a token sees the tokens at most
``local_attention / 2`` positions away on either side (a window both ways,
``AttentionOptions.window_both_ways``). The classifier pools (CLS or mean, per
``classifier_pooling``), then ``head`` (dense, activation, norm) and ``classifier``.
"""

from __future__ import annotations

import functools
import re
from typing import ClassVar

import torch
from torch import nn

from octavo.attention.options import AttentionOptions
from octavo.distributed.parallel_state import pipeline_stage
from octavo.model_executor.layers.activation import GeluAndMul, GeluTanhAndMul, SiluAndMul
from octavo.model_executor.layers.attention import Attention
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.layers.vocab import VocabParallelEmbedding
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.causal_lm import CausalLM, StepResult
from octavo.model_executor.models.encoder import EncoderModel, activation, classifier_labels
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.rope_parameters import rope_parameters_for
from octavo.pooling.params import PoolerConfig, PoolingType

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer types
GATED_ACTIVATIONS = {
    "gelu": GeluAndMul,
    "gelu_pytorch_tanh": GeluTanhAndMul,
    "gelu_new": GeluTanhAndMul,
    "silu": SiluAndMul,
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
LAYER_NAMES = {  # inside ``layers.N.`` -> ours
    "attn.Wqkv": "self_attn.qkv_proj",
    "attn.Wo": "self_attn.o_proj",
    "mlp.Wi": "mlp.gate_up_proj",
    "mlp.Wo": "mlp.down_proj",
    "attn_norm": "attn_norm",
    "mlp_norm": "mlp_norm",
}
TOP_NAMES = {
    "embeddings.tok_embeddings": "embed_tokens",
    "embeddings.norm": "embed_norm",
    "final_norm": "final_norm",
}


class LocalWindowAttention(Attention):
    """Attention whose window (if any) bounds the keys on both sides of the query."""

    def options(self) -> AttentionOptions:
        window = self.spec.sliding_window
        return AttentionOptions(window, window_both_ways=window is not None)


class ModernBertLayer(nn.Module):
    """Pre-norm: ``h = x + attention(norm(x))`` (no norm before layer 0's attention),
    then ``h + mlp(norm(h))``."""

    is_state_layer = False

    def __init__(self, config: ModelConfig, spec: AttentionSpec, index: int, method) -> None:
        super().__init__()
        hf, size = config.hf, config.hidden_size
        eps, bias = float(hf.norm_eps), bool(hf.norm_bias)
        self.attn_norm = nn.LayerNorm(size, eps=eps, bias=bias) if index else nn.Identity()
        self.self_attn = LocalWindowAttention(size, spec, "rms", eps, method)
        self.mlp_norm = nn.LayerNorm(size, eps=eps, bias=bias)
        act = gated_activation(hf.hidden_activation)
        self.mlp = GatedMLP(size, config.intermediate_size, act, method, bias=bool(hf.mlp_bias))

    @property
    def num_kv_heads(self) -> int:
        return self.self_attn.num_kv_heads

    def forward(self, hidden, rope, kv_cache, meta, attention) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.attn_norm(hidden), rope, kv_cache, meta, attention)
        return hidden + self.mlp(self.mlp_norm(hidden))


def gated_activation(name: str) -> nn.Module:
    if name not in GATED_ACTIVATIONS:
        raise ValueError(
            f"hidden_activation {name!r} is not supported; known: {sorted(GATED_ACTIVATIONS)}"
        )
    return GATED_ACTIVATIONS[name]()


class ModernBertModel(EncoderModel):
    architectures = ("ModernBertModel",)
    stored_fused_modules: ClassVar[dict[str, str]] = {
        "self_attn.qkv_proj": "self_attn.qkv",
        "mlp.gate_up_proj": "mlp.gate_up",
    }

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        nn.Module.__init__(self)
        self.config, self.quantization = config, quantization
        self.stage = pipeline_stage()
        if not (self.stage.is_first and self.stage.is_last):
            raise ValueError(f"{config.architecture} runs without pipeline parallelism")
        self.first_layer, self.norm, self.lm_head = 0, None, None
        hf, size = config.hf, config.hidden_size
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, size)
        self.embed_norm = nn.LayerNorm(size, eps=float(hf.norm_eps), bias=bool(hf.norm_bias))
        method = functools.partial(linear_method_for, quantization)
        self.layers = nn.ModuleList(
            ModernBertLayer(config, self.layer_attention_spec(index), index, method)
            for index in range(config.num_layers)
        )
        self.final_norm = nn.LayerNorm(size, eps=float(hf.norm_eps), bias=bool(hf.norm_bias))
        self.rotary = {}
        self.position_offset = 0
        self.requires_grad_(False)

    def layer_type(self, index: int) -> str:
        every = int(getattr(self.config.hf, "global_attn_every_n_layers", 1) or 1)
        types = getattr(self.config.hf, "layer_types", None)
        if types:
            return types[index]
        return LOCAL if index % every else GLOBAL

    def layer_attention_spec(self, index: int) -> AttentionSpec:
        """A local layer's window: keys at most ``local_attention / 2`` away, either side."""
        config, kind = self.config, self.layer_type(index)
        bias = bool(config.hf.attention_bias)
        window = int(config.hf.local_attention) // 2 + 1 if kind == LOCAL else None
        return AttentionSpec(
            num_heads=config.num_heads,
            num_kv_heads=config.num_heads,
            head_dim=config.head_dim,
            qkv_bias=bias,
            o_bias=bias,
            rope=kind,
            sliding_window=window,
        )

    def rope_parameters(self) -> dict[str, dict]:
        raw = self.config.hf.to_dict()
        kinds = {self.layer_type(index) for index in range(self.config.num_layers)}
        return {kind: rope_parameters_for(raw, kind) for kind in kinds}

    def set_rotary(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        CausalLM.set_rotary(self, max_positions, dtype, device)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        name = name.removeprefix("model.")
        module, _, kind = name.rpartition(".")
        if module in TOP_NAMES:
            return f"{TOP_NAMES[module]}.{kind}"
        match = _LAYER.match(module)
        if match is None or match.group(2) not in LAYER_NAMES:
            return None  # the masked-LM head, a classifier's head in an embedding model
        return f"layers.{match.group(1)}.{LAYER_NAMES[match.group(2)]}.{kind}"

    def extra_weight_keys(self) -> set[str]:
        norms = ("embed_norm", "final_norm")
        keys = {
            f"{norm}.{name}"
            for norm in norms
            for name, _ in self.get_submodule(norm).named_parameters()
        }
        return keys | {f"{name}.{key}" for name, key in self.head_weight_keys()}

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
        """The final (normed) hidden states of the ``pooled_indices`` rows."""
        assert self.rotary, "set_rotary before running the model"
        ropes = {name: table.for_step(positions) for name, table in self.rotary.items()}
        hidden = self.embed_norm(self.embed_tokens(input_ids))
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            rope = ropes[layer.self_attn.spec.rope]
            hidden = layer(hidden, rope, kv_cache, meta, attention)
        pooled = None if pooled_indices is None else self.final_norm(hidden[pooled_indices])
        return StepResult(None, pooled)


class ModernBertForSequenceClassification(ModernBertModel):
    """``classifier(norm(act(dense(pooled))))``: the logits of ``num_labels`` classes."""

    architectures = ("ModernBertForSequenceClassification",)
    classifies = True

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        hf, size = config.hf, config.hidden_size
        self.head = nn.ModuleDict(
            {
                "dense": nn.Linear(size, size, bias=bool(hf.classifier_bias)),
                "act": activation(hf.classifier_activation),
                "norm": nn.LayerNorm(size, eps=float(hf.norm_eps), bias=bool(hf.norm_bias)),
            }
        )
        self.classifier = nn.Linear(size, classifier_labels(config))
        self.requires_grad_(False)

    @classmethod
    def pooler_defaults(cls, config: ModelConfig) -> PoolerConfig:
        """The pooling the checkpoint was trained with (``classifier_pooling``)."""
        pooling = str(getattr(config.hf, "classifier_pooling", "cls"))
        if pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling {pooling!r} is not supported (cls or mean)")
        kind = PoolingType.CLS if pooling == "cls" else PoolingType.MEAN
        return PoolerConfig(kind, False, classifier_labels(config), classifies=True)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        if name.startswith(("head.", "classifier.")):
            return name
        return super().checkpoint_name(name)

    def head_weight_keys(self) -> list[tuple[str, str]]:
        modules = [(name, self.get_submodule(name)) for name in ("head.dense", "head.norm")]
        modules.append(("classifier", self.classifier))
        return [(name, key) for name, module in modules for key, _ in module.named_parameters()]

    def pooling_head(self, pooled: torch.Tensor) -> torch.Tensor:
        head = self.head
        hidden = head["norm"](head["act"](head["dense"](pooled.to(self.classifier.weight.dtype))))
        return self.classifier(hidden)
