"""Putting LoRA layers around a loaded model's linears and filling their slots."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.lora.peft_adapter import PeftAdapter
from octavo.model_executor.layers.linear import LinearBase, RowParallelLinear
from octavo.model_executor.layers.lora import LoRALinear, LoRASize, LoRAState, lora_slices
from octavo.model_executor.models.causal_lm import CausalLM


@dataclass
class AdaptedLinear:
    layer: int  # the model's layer index (whole model, across pipeline stages)
    modules: tuple[str, ...]
    lora: LoRALinear


class LoRAModel:
    """The model's LoRA layers and the state they read each step."""

    def __init__(self, model: CausalLM, size: LoRASize) -> None:
        self.state = LoRAState()
        self.linears: list[AdaptedLinear] = []
        for index, decoder in enumerate(model.layers):
            for path, modules in model.lora_modules.items():
                parent_path, _, attr = path.rpartition(".")
                parent = decoder.get_submodule(parent_path)
                base = getattr(parent, attr, None)
                if not isinstance(base, LinearBase):
                    continue  # e.g. the MLP of a mixture-of-experts layer
                start = base.input_start if isinstance(base, RowParallelLinear) else None
                lora = LoRALinear(base, lora_slices(base, modules), start, size, self.state)
                setattr(parent, attr, lora)
                self.linears.append(AdaptedLinear(model.first_layer + index, modules, lora))
        self.adaptable = {module for adapted in self.linears for module in adapted.modules}

    def load(self, slot: int, adapter: PeftAdapter) -> None:
        covered = {(a.layer, module) for a in self.linears for module in a.modules}
        layers_here = {layer for layer, _ in covered}  # this pipeline stage's
        unsupported = sorted(
            {
                m
                for layer, m in adapter.weights
                if layer in layers_here and (layer, m) not in covered
            }
        )
        if unsupported:
            raise ValueError(
                f"LoRA on {', '.join(unsupported)} is not supported for this model (its "
                f"feed-forward layers are experts); adapt {', '.join(sorted(self.adaptable))}"
            )
        for adapted in self.linears:
            weights = {
                module: adapter.weights[(adapted.layer, module)]
                for module in adapted.modules
                if (adapted.layer, module) in adapter.weights
            }
            adapted.lora.set_slot(slot, weights, adapter.scaling)
