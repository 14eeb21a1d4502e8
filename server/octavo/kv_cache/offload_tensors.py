"""The KV offload tier's host tensors on one rank, and the copies into and out of them.

Each rank keeps ``num_slots`` blocks of its own shard of every layer's cache (its
stage's layers, its KV heads) in host memory, shaped as the cache; the scheduler's
``TierCopy`` records name block ids and slots only, so every rank replays the same list
on its own shard (tensor and pipeline parallelism need nothing more).

Copies run one block at a time in the order given. On a CUDA device
the tier is pinned and the copies are issued on a side stream that first waits for the
work already queued (the blocks saved hold finished keys/values); the compute stream
then waits for the copies' event before the step's forward pass, so the host thread
never blocks on them. On CPU the tier is a shared mapping of an unlinked file (the RAM
already holds the cache; the kernel pages the tier out to disk: ``mapped_tier_file``) and
the copies are synchronous.
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
            _copy_in_order(caches, self.tensors, copies)
            return
        self._apply_on_side_stream(caches, copies)

    def _apply_on_side_stream(self, caches: list[torch.Tensor], copies: list[TierCopy]) -> None:
        assert self.stream is not None
        compute = torch.cuda.current_stream(caches[0].device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            _copy_in_order(caches, self.tensors, copies, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        compute.wait_event(done)


def _copy_in_order(
    caches: list[torch.Tensor],
    tiers: list[torch.Tensor],
    copies: list[TierCopy],
    non_blocking: bool = False,
) -> None:
    """Each copy in turn, one block of every layer (as bytes, so an fp8 cache's values stay
    as stored). On CPU a block copy per layer costs about a tenth of the CPU time of one
    indexed copy over a run of blocks, and replaying in order needs no care for a place
    written twice."""
    raw = [(_raw(cache), _raw(tier)) for cache, tier in zip(caches, tiers, strict=True)]
    for copy in copies:
        for cache, tier in raw:
            if copy.to_tier:
                tier[:, copy.slot].copy_(cache[:, copy.block_id], non_blocking=non_blocking)
            else:
                cache[:, copy.block_id].copy_(tier[:, copy.slot], non_blocking=non_blocking)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor
