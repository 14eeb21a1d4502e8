"""Architecture name (``config.json`` ``architectures[0]``) → the model class that runs it.

The one place that knows where the concrete model classes live (vLLM's ``ModelRegistry``
idea): the loader, the worker and LoRA ask here and see only the ``CausalLM`` interface.
Each class declares what it serves (``architectures``, ``pooling_architectures``,
``takes_images``); ``MANIFEST`` only says which module to import for a name, so a process
imports just the architecture it serves. A test checks the manifest against the classes.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from octavo.model_executor.models.causal_lm import CausalLM

PACKAGE = "octavo.model_executor.models"
# module under PACKAGE -> the architectures (and pooling aliases) its classes declare
MANIFEST: dict[str, tuple[str, ...]] = {
    "llama": (
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "MistralForCausalLM",
        "LlamaModel",
        "Qwen2Model",
        "MistralModel",
        "Qwen2ForSequenceClassification",
    ),
    "llama4": ("Llama4ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Model", "Qwen3ForSequenceClassification"),
    "qwen3_moe": ("Qwen3MoeForCausalLM",),
    "qwen3_next": ("Qwen3NextForCausalLM",),
    "mixtral": ("MixtralForCausalLM",),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Model"),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextModel"),
    "gemma3_mm": ("Gemma3ForConditionalGeneration",),
    "phi3": ("Phi3ForCausalLM",),
    "granite": ("GraniteForCausalLM",),
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM",),
    "olmo2": ("Olmo2ForCausalLM",),
    "olmo3": ("Olmo3ForCausalLM",),
    "smollm3": ("SmolLM3ForCausalLM",),
    "gpt_oss": ("GptOssForCausalLM",),
    "deepseek_v2": ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
    "lfm2": ("Lfm2ForCausalLM",),
    "glm4_moe": ("Glm4MoeForCausalLM",),
    "minimax_m2": ("MiniMaxM2ForCausalLM",),
    "bert": ("BertModel", "BertForSequenceClassification"),
    "roberta": (
        "RobertaModel",
        "XLMRobertaModel",
        "RobertaForSequenceClassification",
        "XLMRobertaForSequenceClassification",
    ),
    "modernbert": ("ModernBertModel", "ModernBertForSequenceClassification"),
    "llava": ("LlavaForConditionalGeneration",),
    "idefics3": ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"),
    "llava_next": ("LlavaNextForConditionalGeneration",),
    "mistral3": ("Mistral3ForConditionalGeneration",),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration",),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration",),
}
_MODULE_OF = {name: module for module, names in MANIFEST.items() for name in names}
# GGUF ``general.architecture`` -> the architectures whose classes declare its layout
# (``gguf_layout``); llama.cpp writes Mixtral as a Llama with experts.
GGUF_MANIFEST: dict[str, tuple[str, ...]] = {
    "llama": ("LlamaForCausalLM", "MixtralForCausalLM"),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "qwen3moe": ("Qwen3MoeForCausalLM",),
    "phi3": ("Phi3ForCausalLM",),
    "gemma2": ("Gemma2ForCausalLM",),
    "gemma3": ("Gemma3ForCausalLM",),
    "olmo2": ("Olmo2ForCausalLM",),
    "granite": ("GraniteForCausalLM",),
    "smollm3": ("SmolLM3ForCausalLM",),
    "gpt-oss": ("GptOssForCausalLM",),
}


def supported_architectures() -> list[str]:
    return sorted(_MODULE_OF)


def check_architecture(architecture: str) -> str:
    """``architecture`` itself, or one clear line naming the supported ones."""
    if architecture not in _MODULE_OF:
        raise ValueError(
            f"unsupported architecture {architecture!r}; Octavo runs "
            f"{', '.join(supported_architectures())}"
        )
    return architecture


def declared_architectures(cls: type) -> tuple[str, ...]:
    """What ``cls`` itself declares it serves (its own names, not a base class's)."""
    own = vars(cls)
    return (*own.get("architectures", ()), *own.get("pooling_architectures", ()))


def module_classes(module_name: str) -> list[type[CausalLM]]:
    """The model classes ``module_name`` defines (those declaring architectures)."""
    module = importlib.import_module(f"{PACKAGE}.{module_name}")
    return [
        cls
        for cls in vars(module).values()
        if inspect.isclass(cls) and cls.__module__ == module.__name__
        if declared_architectures(cls)
    ]


def model_class(architecture: str) -> type[CausalLM]:
    module_name = _MODULE_OF[check_architecture(architecture)]
    for cls in module_classes(module_name):
        if architecture in declared_architectures(cls):
            return cls
    raise LookupError(f"{PACKAGE}.{module_name} declares no class for {architecture!r}")


def takes_images(architecture: str) -> bool:
    return model_class(architecture).takes_images


def keeps_images_whole(architecture: str) -> bool:
    """Does the model attend both ways within an image (Gemma 3)? Then the scheduler never
    splits an image's placeholders over two prefill chunks."""
    cls = model_class(architecture)
    return cls.takes_images and getattr(cls, "bidirectional_images", False)


def has_state_layers(config) -> bool:
    """Does the model keep a state slot per sequence in some layers (hybrid models)?"""
    return model_class(config.architecture).has_state_layers(config)


def is_pooling_architecture(architecture: str) -> bool:
    """A checkpoint of the bare decoder (no LM head), an encoder or a sequence classifier:
    served for pooling."""
    cls = model_class(architecture)
    classifies = getattr(cls, "classifies", False)
    return cls.is_encoder or classifies or architecture in cls.pooling_architectures


def is_encoder(architecture: str) -> bool:
    """A bidirectional encoder (BERT family): whole prompts, no prefix caching."""
    return model_class(architecture).is_encoder


def gguf_class(arch: str, with_experts: bool = False) -> type[CausalLM] | None:
    """The class that reads GGUF files of ``arch``: the one with a MoE block when the file
    stacks experts (None: no class reads such a file)."""
    classes = [model_class(name) for name in GGUF_MANIFEST.get(arch, ())]
    for cls in classes:
        if (vars(cls)["gguf_layout"].moe_block is not None) == with_experts:
            return cls
    return classes[0] if classes and not with_experts else None
