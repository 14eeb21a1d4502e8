"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): the Qwen 2 decoder with M-RoPE and
the Qwen2.5-VL vision transformer (``vision/qwen2_5_vl.py``).

As transformers' ``modeling_qwen2_5_vl``: each image's features (one per spatial-merge
unit of its patches) replace its ``<|image_pad|>`` placeholders, and the decoder's rope
is multimodal: the rotary frequencies are split by ``mrope_section`` between the
temporal, height and width positions (``mrope_rotary.py``), which the runner builds for
each step from the prompt's 3-D positions (``mrope_positions.py``; ``qwen_vl.py`` says
where each image's grid lies).
"""

from __future__ import annotations

from octavo.model_executor.model_config import ModelConfig, transformers_config
from octavo.model_executor.models.llama import Qwen2ForCausalLM
from octavo.model_executor.models.qwen_vl import QwenVLImages
from octavo.model_executor.vision.qwen2_5_vl import QWEN_BLOCK_NAMES, Qwen2_5_VisionTower


class Qwen2_5_VLForConditionalGeneration(QwenVLImages, Qwen2ForCausalLM):
    architectures = ("Qwen2_5_VLForConditionalGeneration",)
    block_names = QWEN_BLOCK_NAMES

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        vision = transformers_config(config.checkpoint).vision_config
        self.merge = vision.spatial_merge_size
        self.visual = Qwen2_5_VisionTower(vision)
        self.requires_grad_(False)
