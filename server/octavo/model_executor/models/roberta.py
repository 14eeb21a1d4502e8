"""RoBERTa and XLM-RoBERTa (multilingual e5, bge-m3, bge-reranker): BERT's layers with
positions counted from ``padding_idx + 1`` and, for classification, RoBERTa's head
(``dense`` + tanh over the CLS row, then ``out_proj``) instead of BERT's pooler."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.bert import BertModel
from octavo.model_executor.models.encoder import classifier_labels


class RobertaModel(BertModel):
    architectures = ("RobertaModel", "XLMRobertaModel")
    prefixes: ClassVar[tuple[str, ...]] = ("roberta.",)

    @classmethod
    def position_offset_of(cls, config: ModelConfig) -> int:
        """Positions start after the padding index (``create_position_ids_from_input_ids``)."""
        return int(getattr(config.hf, "pad_token_id", 1) or 0) + 1


class RobertaForSequenceClassification(RobertaModel):
    architectures = ("RobertaForSequenceClassification", "XLMRobertaForSequenceClassification")
    classifies = True

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        size = config.hidden_size
        self.classifier = nn.ModuleDict(
            {"dense": nn.Linear(size, size), "out_proj": nn.Linear(size, classifier_labels(config))}
        )
        self.requires_grad_(False)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        if name.startswith("classifier."):
            return name
        return super().checkpoint_name(name)

    def head_weight_keys(self) -> list[tuple[str, str]]:
        modules = ("classifier.dense", "classifier.out_proj")
        return [(m, k) for m in modules for k in ("weight", "bias")]

    def pooling_head(self, pooled: torch.Tensor) -> torch.Tensor:
        head = self.classifier
        hidden = torch.tanh(head["dense"](pooled.to(head["dense"].weight.dtype)))
        return head["out_proj"](hidden)
