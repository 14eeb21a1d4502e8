"""The expert checkpoint names of the MoE families the layer tests build ``FusedMoE`` with,
as their model classes declare them (``expert_names``)."""

from __future__ import annotations

from octavo.model_executor.models.registry import model_class

QWEN_MOE = model_class("Qwen3MoeForCausalLM").expert_names
MIXTRAL = model_class("MixtralForCausalLM").expert_names
GPT_OSS = model_class("GptOssForCausalLM").expert_names
