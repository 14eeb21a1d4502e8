"""Llama 2/3, Qwen 2 and Mistral: the plain pre-norm decoder ``CausalLM`` is."""

from __future__ import annotations

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.models.causal_lm import CausalLM


class LlamaForCausalLM(CausalLM):
    architectures = ("LlamaForCausalLM",)
    pooling_architectures = ("LlamaModel",)
    gguf_layout = GgufLayout("llama", permuted_qk=True)


class Qwen2ForCausalLM(CausalLM):
    architectures = ("Qwen2ForCausalLM",)
    pooling_architectures = ("Qwen2Model",)
    gguf_layout = GgufLayout("qwen2")

    def o_proj_bias(self) -> bool:
        return False  # Q/K/V have biases, the output projection none


class MistralForCausalLM(CausalLM):
    architectures = ("MistralForCausalLM",)
    pooling_architectures = ("MistralModel",)
