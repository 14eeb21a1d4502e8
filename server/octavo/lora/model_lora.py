"""Putting LoRA layers around a loaded model's linears and filling their slots."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.lora.peft_adapter import PeftAdapter
from octavo.model_executor.layers.linear import RowParallelLinear
from octavo.model_executor.layers.lora import LoRALinear, LoRASize, LoRAState, lora_slices
from octavo.model_executor.llama import LlamaForCausalLM

# A decoder layer's linear -> the PEFT modules it fuses, in its output order.
LAYER_MODULES = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}


@dataclass
class AdaptedLinear:
    layer: int  # the model's layer index (whole model, across pipeline stages)
    modules: tuple[str, ...]
    lora: LoRALinear


class LoRAModel:
    """The model's LoRA layers and the state they read each step."""

    def __init__(self, model: LlamaForCausalLM, size: LoRASize) -> None:
        self.state = LoRAState()
        self.linears: list[AdaptedLinear] = []
        for index, decoder in enumerate(model.layers):
            for attr, modules in LAYER_MODULES.items():
                base = getattr(decoder, attr)
                start = base.input_start if isinstance(base, RowParallelLinear) else None
                lora = LoRALinear(base, lora_slices(base, modules), start, size, self.state)
                setattr(decoder, attr, lora)
                self.linears.append(AdaptedLinear(model.first_layer + index, modules, lora))

    def load(self, slot: int, adapter: PeftAdapter) -> None:
        for adapted in self.linears:
            weights = {module: adapter.weights[(adapted.layer, module)]
                       for module in adapted.modules
                       if (adapted.layer, module) in adapter.weights}  # fmt: skip
            adapted.lora.set_slot(slot, weights, adapter.scaling)
