"""The tensor-parallel group of this process: its rank, the group's size, the collectives.

One process (rank 0 of 1) until tensor parallelism starts workers; the layers read the
group from here, so the same model code serves one rank or many.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorParallelGroup:
    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} outside a group of {self.size}")

    def shard(self, total: int, what: str) -> tuple[int, int]:
        """``[start, end)`` of this rank's equal share of ``total`` items."""
        if total % self.size:
            raise ValueError(
                f"{what} ({total}) is not divisible by tensor_parallel_size {self.size}"
            )
        per_rank = total // self.size
        return self.rank * per_rank, (self.rank + 1) * per_rank

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place (nothing to do for one rank)."""
        if self.size > 1:
            torch.distributed.all_reduce(tensor)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        """The ranks' pieces side by side along the last dimension."""
        if self.size == 1:
            return tensor
        pieces = [torch.empty_like(tensor) for _ in range(self.size)]
        torch.distributed.all_gather(pieces, tensor.contiguous())
        return torch.cat(pieces, dim=-1)


_GROUP = TensorParallelGroup()


def tensor_parallel_group() -> TensorParallelGroup:
    return _GROUP


def set_tensor_parallel_group(group: TensorParallelGroup) -> None:
    """Called once per worker process before its model is built."""
    global _GROUP
    _GROUP = group
