"""``LoRARequest``: which adapter a request runs with (vLLM's spelling)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int  # > 0; the engine's key for the adapter (and its prefix-cache salt)
    lora_path: str  # a PEFT folder: adapter_config.json + adapter_model.safetensors

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_request: lora_name must not be empty")
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_request: lora_int_id must be an integer >= 1, "
                             f"got {self.lora_int_id!r}")  # fmt: skip
