"""SmolLM3 (``SmolLM3ForCausalLM``): the Llama decoder with layers that skip rope (NoPE).

As transformers' ``modeling_smollm3``: ``no_rope_layers[i]`` is 1 where layer ``i``
*uses* rope and 0 where it does not (the config fills it with a NoPE layer every
``no_rope_layer_interval`` layers when absent). A layer slides only when
``use_sliding_window`` is set and ``layer_types[i]`` is ``sliding_attention``: the
``ModelConfig``'s ``window_of``, which the KV block freeing reads too.
"""

from __future__ import annotations

import dataclasses

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.model_config import FULL_ATTENTION
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec


class SmolLM3ForCausalLM(CausalLM):
    architectures = ("SmolLM3ForCausalLM",)
    gguf_layout = GgufLayout("smollm3", permuted_qk=True, model_type="smollm3")

    def attention_spec(self, index: int) -> AttentionSpec:
        uses_rope = bool(self.config.hf.no_rope_layers[index])
        return dataclasses.replace(
            super().attention_spec(index), rope=FULL_ATTENTION if uses_rope else None
        )
