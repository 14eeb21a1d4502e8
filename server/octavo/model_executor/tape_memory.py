"""Memory planning for recorded CPU decode forwards (``cpu_graphs``).

A recording keeps every tensor its forward allocated: each layer's activations, for the
life of the server (SmolLM2 over 7 sizes up to 64 rows: 89 MiB). A replay touches them all
once a step, so a 64-row step also walks tens of MiB of fresh memory where the eager
forward's allocator hands the same few warm blocks out again.

The tape says when each allocation is first and last used, so its tensors can share one
arena the way an inductor graph's buffers do: allocations whose uses do not overlap get
the same bytes (first fit, largest first). Every recorded size replays alone and its
result is copied out before the next, so all sizes share one arena as well, and it holds
only the largest size's busiest moment (a layer's working set and the logits).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten, tree_map

ALIGNMENT = 64  # bytes: a cache line, and a multiple of every element size


@dataclass
class Lifetime:
    """One allocation of the recording: its size and the steps that use it."""

    nbytes: int
    first: int  # index of the first step that reads or writes it
    last: int  # index of the last one
    offset: int = 0  # where it lives in the arena, once planned

    def overlaps(self, other: Lifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def plan_offsets(lifetimes: Iterable[Lifetime]) -> int:
    """Give each lifetime the lowest aligned offset free of every placed lifetime that
    overlaps it in time, largest first; returns the arena's size in bytes."""
    placed: list[Lifetime] = []
    for life in sorted(lifetimes, key=lambda life: life.nbytes, reverse=True):
        busy = sorted((p.offset, p.offset + p.nbytes) for p in placed if p.overlaps(life))
        offset = 0
        for start, end in busy:
            if offset + life.nbytes <= start:
                break
            offset = max(offset, _aligned(end))
        life.offset = offset
        placed.append(life)
    return max((life.offset + life.nbytes for life in placed), default=0)


def _tensors(value) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]


def lifetimes(uses: list[tuple], fresh: dict[int, torch.UntypedStorage]) -> dict[int, Lifetime]:
    """The lifetime of each ``fresh`` storage (keyed by its address) over the steps, whose
    tensors ``uses[i]`` holds (any nesting)."""
    found: dict[int, Lifetime] = {}
    for index, use in enumerate(uses):
        for tensor in _tensors(use):
            key = tensor.untyped_storage().data_ptr()
            if key not in fresh:
                continue
            life = found.get(key)
            if life is None:
                found[key] = Lifetime(fresh[key].nbytes(), index, index)
            else:
                life.last = index
    return found


def rebased(value, plan: dict[int, Lifetime], arena: torch.UntypedStorage):
    """``value`` (any nesting) with each tensor over a planned storage replaced by the same
    view over the arena, at the storage's planned offset."""

    def move(leaf):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        life = plan.get(leaf.untyped_storage().data_ptr())
        if life is None:
            return leaf
        start = life.offset // leaf.element_size() + leaf.storage_offset()
        moved = torch.empty(0, dtype=leaf.dtype, device=leaf.device)
        return moved.set_(arena, start, leaf.size(), leaf.stride())

    return tree_map(move, value)
