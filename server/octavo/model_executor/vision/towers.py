"""The vision tower a LLaVA-style checkpoint names in its ``vision_config.model_type``:
CLIP's (LLaVA-1.5) or Pixtral's (Pixtral-12B is a ``LlavaForConditionalGeneration``).

Both give transformers' ``hidden_states`` list for a batch of images of one size
(``hidden_states(pixel_values)``); the projector and decoder around them are LLaVA's.
"""

from __future__ import annotations

from torch import nn

from octavo.model_executor.vision.clip import CLIPVisionTower
from octavo.model_executor.vision.pixtral import PixtralVisionTower, pixtral_checkpoint_name

TOWERS: dict[str, type[nn.Module]] = {"pixtral": PixtralVisionTower}  # others: CLIP's


def vision_tower_for(config, num_layers: int) -> nn.Module:
    """The tower of ``config`` (a ``vision_config``) with its first ``num_layers`` layers."""
    tower = TOWERS.get(getattr(config, "model_type", ""), CLIPVisionTower)
    return tower(config, num_layers)


def tower_checkpoint_name(name: str) -> str:
    """A checkpoint tensor's name (in our prefixes) as our modules carry it: in a Pixtral
    tower's layers, CLIP's names for Pixtral's (CLIP's own names have none of them)."""
    return pixtral_checkpoint_name(name) if name.startswith("vision_tower.") else name
