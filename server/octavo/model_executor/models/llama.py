"""Llama 2/3, Qwen 2 and Mistral: the plain pre-norm decoder ``CausalLM`` is."""

from __future__ import annotations

import dataclasses

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.models.sequence_classification import SequenceClassifier


class LlamaForCausalLM(CausalLM):
    architectures = ("LlamaForCausalLM",)
    pooling_architectures = ("LlamaModel",)
    gguf_layout = GgufLayout("llama", permuted_qk=True)


class Qwen2ForCausalLM(CausalLM):
    architectures = ("Qwen2ForCausalLM",)
    pooling_architectures = ("Qwen2Model",)
    gguf_layout = GgufLayout("qwen2")

    def attention_spec(self, index: int) -> AttentionSpec:
        """Q/K/V have biases (the config has no flag for them)."""
        return dataclasses.replace(super().attention_spec(index), qkv_bias=True)

    def o_proj_bias(self) -> bool:
        return False  # Q/K/V have biases, the output projection none


class MistralForCausalLM(CausalLM):
    architectures = ("MistralForCausalLM",)
    pooling_architectures = ("MistralModel",)


class Qwen2ForSequenceClassification(SequenceClassifier, Qwen2ForCausalLM):
    """Qwen 2 with a ``score`` head on the last token (mxbai-rerank-v2 through
    ``classifier_from_token``)."""

    architectures = ("Qwen2ForSequenceClassification",)
    pooling_architectures = ()
