"""State slots: the fixed-size per-sequence state of state layers (hybrid models).

A state layer (LFM2's short convolution, Mamba2, gated DeltaNet) keeps, instead of
keys and values per token, a few tensors per running sequence. Each running sequence
owns one slot (an int >= 1; slot 0 is a null slot never handed out): taken at
admission, freed at finish and at preemption (the sequence recomputes from scratch),
copied when a sequence forks for n > 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateSpec:
    """What one state layer keeps per slot: one shape per state tensor (without the slot
    dimension, for this tensor-parallel rank's shard) and their dtype (None = the
    model's dtype)."""

    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype | None = None

    def bytes_per_slot(self, model_dtype: torch.dtype) -> int:
        itemsize = (self.dtype or model_dtype).itemsize
        return sum(itemsize * _numel(shape) for shape in self.shapes)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
