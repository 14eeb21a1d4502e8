"""The KV offload tier's host tensors on one rank, and the copies into and out of them.

Each rank keeps ``num_slots`` blocks of its own shard of every layer's cache (its
stage's layers, its KV heads) in host memory, shaped as the cache; the scheduler's
``TierCopy`` records name block ids and slots only, so every rank replays the same list
on its own shard (tensor and pipeline parallelism need nothing more).

Copies run in the order given, grouped into runs of one direction. On a CUDA device
the tier is pinned and the copies are issued on a side stream that first waits for the
work already queued (the blocks saved hold finished keys/values); the compute stream
then waits for the copies' event before the step's forward pass, so the host thread
never blocks on them. On CPU the tier is a shared mapping of an unlinked file (the RAM
already holds the cache; the kernel pages the tier out to disk: ``mapped_tier_file``) and
the copies are synchronous tensor indexing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.kv_cache.mapped_tier_file import file_backed_zeros
from octavo.kv_cache.offload_tier import TierCopy


@dataclass
class HostTier:
    tensors: list[torch.Tensor]  # per layer: [planes, num_slots, block_size, heads, dim]
    stream: torch.cuda.Stream | None = None  # side stream of a CUDA cache

    @classmethod
    def like(cls, kv_caches: list[torch.Tensor], num_slots: int) -> HostTier:
        """A tier of ``num_slots`` blocks shaped as ``kv_caches`` (the rank's own shard)."""
        caches = [cache for cache in kv_caches if isinstance(cache, torch.Tensor)]
        shapes = [(cache.shape[0], num_slots, *cache.shape[2:]) for cache in caches]
        if caches[0].device.type != "cuda":  # RAM holds the cache: the tier goes to a file
            return cls(file_backed_zeros(shapes, [cache.dtype for cache in caches]))
        tensors = [
            torch.zeros(shape, dtype=cache.dtype, pin_memory=True)
            for shape, cache in zip(shapes, caches, strict=True)
        ]
        return cls(tensors, torch.cuda.Stream(caches[0].device))

    def apply(self, kv_caches: list[torch.Tensor], copies: list[TierCopy]) -> None:
        """Make the step's saves and loads, in order, before its forward pass."""
        if not copies:
            return
        caches = [cache for cache in kv_caches if isinstance(cache, torch.Tensor)]
        if self.stream is None:
            for run in _runs(copies):
                _copy_run(caches, self.tensors, run)
            return
        self._apply_on_side_stream(caches, copies)

    def _apply_on_side_stream(self, caches: list[torch.Tensor], copies: list[TierCopy]) -> None:
        assert self.stream is not None
        compute = torch.cuda.current_stream(caches[0].device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            for copy in copies:
                for cache, tier in zip(caches, self.tensors, strict=True):
                    if copy.to_tier:
                        tier[:, copy.slot].copy_(cache[:, copy.block_id], non_blocking=True)
                    else:
                        cache[:, copy.block_id].copy_(tier[:, copy.slot], non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        compute.wait_event(done)


def _runs(copies: list[TierCopy]) -> list[list[TierCopy]]:
    """``copies`` cut into runs of one direction writing distinct places (an indexed copy
    writing one place twice has no defined order)."""
    runs: list[list[TierCopy]] = []
    written: set[int] = set()
    for copy in copies:
        place = copy.slot if copy.to_tier else copy.block_id
        if not runs or runs[-1][0].to_tier != copy.to_tier or place in written:
            runs.append([])
            written = set()
        runs[-1].append(copy)
        written.add(place)
    return runs


def _copy_run(caches: list[torch.Tensor], tiers: list[torch.Tensor], run: list[TierCopy]) -> None:
    """One run of saves or loads on host tensors: one indexed copy a layer (as bytes, so
    an fp8 cache's values stay as stored)."""
    blocks = torch.tensor([copy.block_id for copy in run])
    slots = torch.tensor([copy.slot for copy in run])
    for cache, tier in zip(caches, tiers, strict=True):
        cache, tier = _raw(cache), _raw(tier)
        if run[0].to_tier:
            tier[:, slots] = cache[:, blocks]
        else:
            cache[:, blocks] = tier[:, slots]


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor
