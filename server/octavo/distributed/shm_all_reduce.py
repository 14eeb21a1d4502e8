"""Tensor-parallel all-reduce (and gather) through shared memory, between CPU workers.

gloo's all-reduce goes through TCP loopback: about a millisecond a call on a small VM,
and a model makes two per layer per step. Here the ranks of one tensor-parallel group
map one segment in ``/dev/shm`` and the native ``shm_all_reduce`` kernel exchanges
tensors through it (copy in, publish, wait, sum in rank order). The segment is unlinked
as soon as every rank has mapped it, so nothing is left in ``/dev/shm`` whatever
happens to the processes. Tensors larger than a slot, or of other dtypes, still go
through gloo; if any rank cannot set the segment up (no native kernels, no /dev/shm
room), the whole group keeps gloo.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
SLOT_BYTES = 8 * 2**20  # per rank and buffer: a step of 2048 tokens × 2048 fp32 hidden
LINE = 64  # bytes of each rank's call counter (one cache line)
DTYPES = (torch.float32, torch.bfloat16)


class SharedMemoryAllReduce:
    def __init__(self, segment: torch.Tensor, ops, rank: int, world: int) -> None:
        self.segment, self.ops, self.rank, self.world = segment, ops, rank, world
        self.calls = 0

    def can_take(self, tensor: torch.Tensor) -> bool:
        """Decided from the tensor alone, so every rank decides the same."""
        return (
            tensor.device.type == "cpu"
            and tensor.dtype in DTYPES
            and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() <= SLOT_BYTES
        )

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self.calls += 1
        self.ops.shm_all_reduce(tensor, self.segment, self.rank, self.world, self.calls, SLOT_BYTES)

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's ``tensor``, in rank order, on rank 0 (``None`` elsewhere)."""
        self.calls += 1
        self.ops.shm_publish(tensor, self.segment, self.rank, self.world, self.calls, SLOT_BYTES)
        if self.rank != 0:
            return None
        start = LINE * self.world + (self.calls & 1) * self.world * SLOT_BYTES
        nbytes = tensor.numel() * tensor.element_size()
        return [
            self.segment.narrow(0, start + rank * SLOT_BYTES, nbytes)
            .view(tensor.dtype)
            .view(tensor.shape)
            .clone()
            for rank in range(self.world)
        ]


def segment_bytes(world: int) -> int:
    return LINE * world + 2 * world * SLOT_BYTES


def open_segment(path: Path, world: int) -> torch.Tensor:
    """Map ``path`` (created and its pages reserved if needed) as a shared byte tensor."""
    size = segment_bytes(world)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)  # fails now if /dev/shm is too small, not with SIGBUS
    finally:
        os.close(fd)
    return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)


def create_shared_all_reduce(
    name: str, rank: int, world: int, group, first_global_rank: int
) -> SharedMemoryAllReduce | None:
    """Collective over ``group``: every rank gets one, or every rank gets ``None``."""
    from octavo.kernels.cpu_build import cpu_ops

    path = SHM_DIR / f"octavo-{name}"
    ops, segment = cpu_ops(), None
    if ops is not None and hasattr(ops, "shm_publish") and SHM_DIR.is_dir():
        try:
            segment = open_segment(path, world)
        except OSError as error:
            logger.warning("no shared-memory all-reduce (%s): using gloo", error)
    agreed = torch.tensor([0 if segment is None else 1])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=group)  # also: everyone has mapped it
    if rank == 0:
        path.unlink(missing_ok=True)
    if not agreed.item():
        return None
    return SharedMemoryAllReduce(segment, ops, rank, world)
