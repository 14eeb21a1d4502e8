"""Which adapters sit in the model's LoRA slots (``max_loras``) and which wait in CPU
memory (``max_cpu_loras``), least recently used out first. Every rank runs the same
steps, so every rank makes the same choices."""

from __future__ import annotations

from collections import OrderedDict

from octavo.lora.model_lora import LoRAModel
from octavo.lora.peft_adapter import PeftAdapter, load_peft_adapter
from octavo.lora_request import LoRARequest
from octavo.model_executor.model_config import ModelConfig


class AdapterSlots:
    def __init__(
        self,
        model: LoRAModel,
        config: ModelConfig,
        max_loras: int,
        max_cpu_loras: int,
        max_rank: int,
    ) -> None:
        self.model, self.config, self.max_rank = model, config, max_rank
        self.state = model.state
        self.max_loras, self.max_cpu_loras = max_loras, max(max_cpu_loras, max_loras)
        self.slots: OrderedDict[int, int] = OrderedDict()  # lora_int_id -> slot, LRU first
        self.cpu: OrderedDict[int, PeftAdapter] = OrderedDict()  # lora_int_id -> weights
        self.num_loads = 0  # adapters read from disk (tests, metrics)

    def slot_of(self, request: LoRARequest, in_use: set[int]) -> int:
        """The slot holding ``request``'s adapter, loading it (evicting the least recently
        used adapter not in ``in_use``, the slots this step already uses) if needed."""
        if request.lora_int_id in self.slots:
            self.slots.move_to_end(request.lora_int_id)
            return self.slots[request.lora_int_id]
        slot = self._free_slot(in_use)
        self.model.load(slot, self._adapter(request))
        self.slots[request.lora_int_id] = slot
        return slot

    def _free_slot(self, in_use: set[int]) -> int:
        taken = set(self.slots.values())
        free = [slot for slot in range(self.max_loras) if slot not in taken]
        if free:
            return free[0]
        for lora_id, slot in self.slots.items():
            if slot not in in_use:
                del self.slots[lora_id]
                return slot
        raise RuntimeError(f"more than max_loras={self.max_loras} adapters in one step")

    def _adapter(self, request: LoRARequest) -> PeftAdapter:
        adapter = self.cpu.pop(request.lora_int_id, None)
        if adapter is None:
            adapter = load_peft_adapter(request.lora_path, self.config, self.max_rank)
            self.num_loads += 1
        self.cpu[request.lora_int_id] = adapter
        while len(self.cpu) > self.max_cpu_loras:
            self.cpu.popitem(last=False)
        return adapter

    def forget(self, lora_int_ids: list[int]) -> None:
        """Drop removed adapters from the slots and from CPU memory."""
        for lora_int_id in lora_int_ids:
            self.slots.pop(lora_int_id, None)
            self.cpu.pop(lora_int_id, None)
