"""OLMo 2 (``Olmo2ForCausalLM``): the Llama decoder in the post-norm layout (no norm
before attention or the MLP; each block's output is RMS-normed before the residual add)
with one RMSNorm over the whole query and the whole key projection (not per head) before
rope. Under tensor parallelism that norm sums its mean square over the ranks
(``ShardedRMSNorm``)."""

from __future__ import annotations

import dataclasses

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import POST_NORM, AttentionSpec, LayerSpec


class Olmo2ForCausalLM(CausalLM):
    architectures = ("Olmo2ForCausalLM",)
    gguf_layout = GgufLayout("olmo2", model_type="olmo2")

    def attention_spec(self, index: int) -> AttentionSpec:
        return dataclasses.replace(super().attention_spec(index), qk_norm="full")

    def layer_spec(self, index: int) -> LayerSpec:
        return dataclasses.replace(super().layer_spec(index), norm_layout=POST_NORM)
