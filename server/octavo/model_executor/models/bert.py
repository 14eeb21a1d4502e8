"""BERT (``BertModel``: embeddings of sentence-transformers folders, e5, bge, MiniLM) and
``BertForSequenceClassification`` (cross-encoder rerankers such as ms-marco MiniLM):
``encoder.EncoderModel`` with BERT's tensor names. The classifier reads BERT's pooler
(``dense`` + tanh over the CLS row) and a linear layer to the labels."""

from __future__ import annotations

import re
from typing import ClassVar

import torch
from torch import nn

from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.encoder import EncoderModel, classifier_labels

_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
LAYER_NAMES = {  # inside ``encoder.layer.N.`` -> ours inside ``layers.N.``
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.o_proj",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "output.LayerNorm": "output_norm",
}
EMBEDDING_NAMES = {
    "embeddings.word_embeddings": "embed_tokens",
    "embeddings.position_embeddings": "embed_positions",
    "embeddings.token_type_embeddings": "embed_token_types",
    "embeddings.LayerNorm": "embed_norm",
}
OLD_NORM_NAMES = {"gamma": "weight", "beta": "bias"}  # TF-era BERT checkpoints


def encoder_tensor_name(name: str, prefixes: tuple[str, ...]) -> str | None:
    """A BERT-layout tensor name in ours (``None``: one Octavo does not use)."""
    for prefix in prefixes:
        name = name.removeprefix(prefix)
    module, _, kind = name.rpartition(".")
    kind = OLD_NORM_NAMES.get(kind, kind)
    if module in EMBEDDING_NAMES:
        return f"{EMBEDDING_NAMES[module]}.{kind}"
    match = _LAYER.match(module)
    if match is None or match.group(2) not in LAYER_NAMES:
        return None
    return f"layers.{match.group(1)}.{LAYER_NAMES[match.group(2)]}.{kind}"


class BertModel(EncoderModel):
    architectures = ("BertModel",)
    prefixes: ClassVar[tuple[str, ...]] = ("bert.",)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        return encoder_tensor_name(name, cls.prefixes)


class BertForSequenceClassification(BertModel):
    """``classifier(tanh(pooler(cls)))``: the logits of ``num_labels`` classes."""

    architectures = ("BertForSequenceClassification",)
    classifies = True

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        self.pooler = nn.ModuleDict({"dense": nn.Linear(config.hidden_size, config.hidden_size)})
        self.classifier = nn.Linear(config.hidden_size, classifier_labels(config))
        self.requires_grad_(False)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        bare = name.removeprefix("bert.")
        if bare.startswith("pooler.dense.") or name.startswith("classifier."):
            return bare
        return super().checkpoint_name(name)

    def head_weight_keys(self) -> list[tuple[str, str]]:
        return [(m, k) for m in ("pooler.dense", "classifier") for k in ("weight", "bias")]

    def pooling_head(self, pooled: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.pooler["dense"](pooled.to(self.classifier.weight.dtype)))
        return self.classifier(hidden)
