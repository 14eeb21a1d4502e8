"""What image models add to their decoder's checkpoint reading alike: checkpoint prefixes
renamed to ours, and every tensor of the vision modules required from the checkpoint.

A model class lists ``VisionCheckpoint`` before its decoder class and sets
``checkpoint_prefixes`` (theirs -> ours, longer prefixes first) and ``vision_modules``
(the attributes holding its tower, projector or connector) where they are not LLaVA's;
``vision_name`` is the hook for a renamed tensor's name as our modules carry it
(``None``: not loaded).
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

# LLaVA-style checkpoints (transformers 4 and Google's files, transformers 5 module
# names) -> ours: LLaVA, LLaVA-NeXT, Mistral 3, Gemma 3.
LLAVA_PREFIXES = {
    "language_model.model.": "model.",
    "model.language_model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "lm_head.": "lm_head.",
    "vision_tower.vision_model.": "vision_tower.",
    "model.vision_tower.vision_model.": "vision_tower.",
    "model.vision_tower.": "vision_tower.",
    "vision_tower.": "vision_tower.",
    "model.multi_modal_projector.": "multi_modal_projector.",
    "multi_modal_projector.": "multi_modal_projector.",
}
LLAVA_MODULES = ("vision_tower", "multi_modal_projector")


class VisionCheckpoint:
    takes_images: ClassVar[bool] = True
    checkpoint_prefixes: ClassVar[dict[str, str]] = LLAVA_PREFIXES
    vision_modules: ClassVar[tuple[str, ...]] = LLAVA_MODULES

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        for prefix, renamed in cls.checkpoint_prefixes.items():
            if name.startswith(prefix):
                return cls.vision_name(renamed + name.removeprefix(prefix))
        return None

    @classmethod
    def vision_name(cls, name: str) -> str | None:
        return name

    def extra_weight_keys(self) -> set[str]:
        """Every tensor of the vision modules must come from the checkpoint."""
        modules: dict[str, nn.Module] = {name: getattr(self, name) for name in self.vision_modules}
        return {
            f"{prefix}.{name}"
            for prefix, module in modules.items()
            for name, _ in module.named_parameters()
        }
