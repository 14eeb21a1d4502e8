"""PEFT module names that stand for several of Octavo's adaptable modules.

Some checkpoints store Q/K/V or gate/up as one matrix (Phi-3's ``qkv_proj`` and
``gate_up_proj``), and PEFT adapters for them adapt that fused module: one ``lora_A``
shared by the pieces and one ``lora_B`` whose rows stack the pieces' outputs. The model
class names them (``lora_fused_modules``: fused name -> pieces, in row order); the adapter
reader accepts those names and splits each ``lora_B`` into one (A, B) per piece.
"""

from __future__ import annotations

from collections.abc import Mapping

from octavo.model_executor.model_config import ModelConfig

FusedModules = Mapping[str, tuple[str, ...]]


def fused_modules(config: ModelConfig) -> FusedModules:
    """The fused PEFT modules of ``config``'s architecture (none for most)."""
    from octavo.model_executor.models.registry import is_pooling_architecture, model_class

    if is_pooling_architecture(config.architecture):
        return {}
    return getattr(model_class(config.architecture), "lora_fused_modules", {})
