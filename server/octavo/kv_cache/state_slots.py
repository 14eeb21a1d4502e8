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


LayerCache = torch.Tensor | tuple[torch.Tensor, ...]  # attention: KV tensor; state: its tensors


def allocate_state(
    spec: StateSpec, num_slots: int, model_dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """One state layer's tensors, ``(num_slots, *shape)`` each, zeroed."""
    dtype = spec.dtype or model_dtype
    return tuple(
        torch.zeros((num_slots, *shape), dtype=dtype, device=device) for shape in spec.shapes
    )


def layer_caches(
    kv_caches: list[torch.Tensor],
    specs: list[StateSpec | None],
    num_slots: int,
    model_dtype: torch.dtype,
    device: torch.device,
) -> list[LayerCache]:
    """Every layer's cache in layer order: the next KV tensor for an attention layer
    (``None`` spec), freshly allocated state tensors for a state layer."""
    kv = iter(kv_caches)
    caches: list[LayerCache] = []
    for spec in specs:
        caches.append(
            next(kv) if spec is None else allocate_state(spec, num_slots, model_dtype, device)
        )
    return caches


def state_bytes(specs: list[StateSpec | None], num_slots: int, model_dtype: torch.dtype) -> int:
    """What the state layers' tensors take (the KV budget pays for them first)."""
    return num_slots * sum(spec.bytes_per_slot(model_dtype) for spec in specs if spec is not None)


def has_state_caches(caches: list[LayerCache]) -> bool:
    return any(isinstance(cache, tuple) for cache in caches)


def copy_states(caches: list[LayerCache], copies: list[tuple[int, int]]) -> None:
    """Forks: each destination slot takes its source slot's state, in every state layer."""
    if not copies:
        return
    states = [cache for cache in caches if isinstance(cache, tuple)]
    if not states:
        return
    device = states[0][0].device
    sources = torch.tensor([src for src, _ in copies], device=device)
    targets = torch.tensor([dst for _, dst in copies], device=device)
    for state in states:
        for tensor in state:
            tensor[targets] = tensor[sources]
