"""Architecture name (``config.json`` ``architectures[0]``) → the model class that runs it.

The one place that knows the concrete model classes (vLLM's ``ModelRegistry`` idea): the
loader, the worker and LoRA ask here and see only the ``CausalLM`` interface. Modules are
imported on first use, so a process loads only the architecture it serves.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from octavo.model_executor.models.causal_lm import CausalLM

# architecture -> (module under octavo.model_executor.models, class name)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "Qwen2ForCausalLM"),
    "MistralForCausalLM": ("llama", "MistralForCausalLM"),
    "Llama4ForCausalLM": ("llama4", "Llama4ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "Gemma3ForConditionalGeneration": ("gemma3_mm", "Gemma3ForConditionalGeneration"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "GraniteForCausalLM": ("granite", "GraniteForCausalLM"),
    "GraniteMoeHybridForCausalLM": ("granitemoehybrid", "GraniteMoeHybridForCausalLM"),
    "Olmo2ForCausalLM": ("olmo2", "Olmo2ForCausalLM"),
    "Olmo3ForCausalLM": ("olmo3", "Olmo3ForCausalLM"),
    "SmolLM3ForCausalLM": ("smollm3", "SmolLM3ForCausalLM"),
    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM"),
    "Lfm2ForCausalLM": ("lfm2", "Lfm2ForCausalLM"),
    "Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeForCausalLM"),
    "MiniMaxM2ForCausalLM": ("minimax_m2", "MiniMaxM2ForCausalLM"),
    "LlavaForConditionalGeneration": ("llava", "LlavaForConditionalGeneration"),
    "Idefics3ForConditionalGeneration": ("idefics3", "Idefics3ForConditionalGeneration"),
    "SmolVLMForConditionalGeneration": ("idefics3", "SmolVLMForConditionalGeneration"),
    "LlavaNextForConditionalGeneration": ("llava_next", "LlavaNextForConditionalGeneration"),
    "Mistral3ForConditionalGeneration": ("mistral3", "Mistral3ForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen3VLForConditionalGeneration": ("qwen3_vl", "Qwen3VLForConditionalGeneration"),
}
# Architectures that take images (their class has ``embed_images``; prompts go through
# the folder's HF processor).
IMAGE_ARCHITECTURES = frozenset(
    {
        "LlavaForConditionalGeneration",
        "LlavaNextForConditionalGeneration",
        "Idefics3ForConditionalGeneration",
        "SmolVLMForConditionalGeneration",
        "Mistral3ForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Gemma3ForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
    }
)
# Checkpoints saved from the bare decoder (no LM head): embedding models such as
# e5-mistral (MistralModel) or gte-Qwen2 (Qwen2Model). Same class; served for pooling.
POOLING_ARCHITECTURES: dict[str, str] = {
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
    "Gemma2Model": "Gemma2ForCausalLM",
    "Gemma3TextModel": "Gemma3ForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted([*ARCHITECTURES, *POOLING_ARCHITECTURES])


def takes_images(architecture: str) -> bool:
    return architecture in IMAGE_ARCHITECTURES


def keeps_images_whole(architecture: str) -> bool:
    """Does the model attend both ways within an image (Gemma 3)? Then the scheduler never
    splits an image's placeholders over two prefill chunks."""
    return takes_images(architecture) and getattr(
        model_class(architecture), "bidirectional_images", False
    )


def has_state_layers(config) -> bool:
    """Does the model keep a state slot per sequence in some layers (hybrid models)?"""
    return model_class(config.architecture).has_state_layers(config)


def is_pooling_architecture(architecture: str) -> bool:
    return architecture in POOLING_ARCHITECTURES


def check_architecture(architecture: str) -> str:
    """``architecture`` itself, or one clear line naming the supported ones."""
    if architecture not in ARCHITECTURES and architecture not in POOLING_ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {architecture!r}; Octavo runs "
            f"{', '.join(supported_architectures())}"
        )
    return architecture


def model_class(architecture: str) -> type[CausalLM]:
    architecture = check_architecture(architecture)
    module_name, class_name = ARCHITECTURES[POOLING_ARCHITECTURES.get(architecture, architecture)]
    module = importlib.import_module(f"octavo.model_executor.models.{module_name}")
    return getattr(module, class_name)
