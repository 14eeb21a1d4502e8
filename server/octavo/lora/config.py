"""The engine's LoRA limits, as the workers and the scheduler need them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int  # adapter slots in the model: most adapters in one step
    max_rank: int
    max_cpu_loras: int  # adapters kept in CPU memory, least recently used dropped first
