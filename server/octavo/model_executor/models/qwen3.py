"""Qwen 3 (dense): Qwen 2's decoder with an RMSNorm over each head's query and key
before rope, no Q/K/V bias (``attention_bias``, false in released checkpoints) and the
config's own ``head_dim`` (not ``hidden_size / heads``). Sliding windows follow the
config's ``layer_types`` (``use_sliding_window`` / ``max_window_layers``)."""

from __future__ import annotations

import dataclasses

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.models.sequence_classification import SequenceClassifier


class Qwen3ForCausalLM(CausalLM):
    architectures = ("Qwen3ForCausalLM",)
    pooling_architectures = ("Qwen3Model",)
    gguf_layout = GgufLayout("qwen3")

    def attention_spec(self, index: int) -> AttentionSpec:
        return dataclasses.replace(super().attention_spec(index), qk_norm="head")


class Qwen3ForSequenceClassification(SequenceClassifier, Qwen3ForCausalLM):
    """Qwen 3 with a ``score`` head on the last token (Qwen3-Reranker through
    ``classifier_from_token``)."""

    architectures = ("Qwen3ForSequenceClassification",)
    pooling_architectures = ()
