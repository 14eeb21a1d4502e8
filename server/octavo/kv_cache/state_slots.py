"""State slots: the fixed-size per-sequence state of state layers (hybrid models).

A state layer (LFM2's short convolution, Mamba2, gated DeltaNet) keeps, instead of
keys and values per token, a few tensors per running sequence. Each running sequence
owns one slot (an int >= 1; slot 0 is a null slot never handed out): taken at
admission, freed at finish and at preemption (the sequence recomputes from scratch),
copied when a sequence forks for n > 1. The worker's tensors: ``state_tensors``.
"""

from __future__ import annotations

import math
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
        return sum(itemsize * math.prod(shape) for shape in self.shapes)


class StateSlots:
    """The scheduler's side: which slot each running sequence owns.

    ``num_slots`` counts the null slot 0, so ``num_slots - 1`` sequences can run at once
    (the engine makes it ``max_num_seqs + 1``). A fork's copy of its parent's state is
    recorded (``pending_copies``) for the model runner to perform before the next step,
    as the KV manager records copy-on-write blocks.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 2:
            raise ValueError(f"state slots: need the null slot and one more, got {num_slots}")
        self.num_slots = num_slots
        self.free_slots = list(range(num_slots - 1, 0, -1))  # pop() hands out 1 first
        self.slot_of: dict[int, int] = {}
        self.pending_copies: list[tuple[int, int]] = []  # (source slot, destination slot)

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    def holds(self, seq_id: int) -> bool:
        return seq_id in self.slot_of

    def take(self, seq_id: int) -> bool:
        """Give ``seq_id`` a slot (admission); False when none is free."""
        if seq_id in self.slot_of:
            return True
        if not self.free_slots:
            return False
        self.slot_of[seq_id] = self.free_slots.pop()
        return True

    def free(self, seq_id: int) -> None:
        """Return the sequence's slot (finish, preemption); nothing if it holds none."""
        slot = self.slot_of.pop(seq_id, None)
        if slot is not None:
            self.free_slots.append(slot)

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child gets a slot of its own holding a copy of the parent's state."""
        if child_id in self.slot_of:
            raise RuntimeError(f"fork {child_id} of {parent_id} already holds a state slot")
        if not self.take(child_id):
            raise RuntimeError(f"no state slot left for fork {child_id} of {parent_id}")
        self.pending_copies.append((self.slot_of[parent_id], self.slot_of[child_id]))

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies
