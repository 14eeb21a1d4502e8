"""This process's place in the parallel layout: its tensor-parallel group and pipeline stage.

One process (rank 0 of 1, the only stage) until workers are started for tensor or
pipeline parallelism; the layers read the groups from here, so the same model code
serves one rank or many. Global ranks are laid out stage by stage:
``rank = stage * tensor_parallel_size + tensor_rank``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from octavo.distributed.comm_timer import timed


@dataclass(frozen=True)
class TensorParallelGroup:
    rank: int = 0
    size: int = 1
    group: Any = None  # torch.distributed ProcessGroup of this stage's ranks
    first_global_rank: int = 0  # global rank of this group's rank 0 (it gathers the logits)
    shared_memory: Any = None  # a SharedMemoryAllReduce for CPU ranks, else gloo/NCCL

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
        if self.size == 1:
            return tensor
        with timed("all_reduce"):
            if self.shared_memory is not None and self.shared_memory.can_take(tensor):
                self.shared_memory.all_reduce(tensor)
            else:
                dist.all_reduce(tensor, group=self.group)
        return tensor

    def gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The ranks' pieces side by side along the last dimension, on rank 0 only
        (``None`` elsewhere): only the driver samples."""
        if self.size == 1:
            return tensor
        tensor = tensor.contiguous()
        with timed("gather"):
            if self.shared_memory is not None and self.shared_memory.can_take(tensor):
                pieces = self.shared_memory.gather(tensor)
            else:
                pieces = [torch.empty_like(tensor) for _ in range(self.size)]
                pieces = pieces if self.rank == 0 else None
                dist.gather(tensor, pieces, dst=self.first_global_rank, group=self.group)
        return torch.cat(pieces, dim=-1) if pieces is not None else None


@dataclass(frozen=True)
class PipelineStage:
    stage: int = 0
    size: int = 1
    tensor_rank: int = 0
    tensor_size: int = 1

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.size - 1

    def layer_range(self, num_layers: int) -> tuple[int, int]:
        """``[first, last)`` of this stage's decoder layers: an even split, the earlier
        stages taking one more when it does not divide (the last stage has the LM head)."""
        if num_layers < self.size:
            raise ValueError(
                f"{num_layers} layers cannot be split over pipeline_parallel_size {self.size}"
            )
        per_stage, extra = divmod(num_layers, self.size)
        first = self.stage * per_stage + min(self.stage, extra)
        return first, first + per_stage + (1 if self.stage < extra else 0)

    def peer(self, stage: int) -> int:
        """Global rank of this tensor rank's counterpart in ``stage``."""
        return stage * self.tensor_size + self.tensor_rank


_GROUP = TensorParallelGroup()
_STAGE = PipelineStage()


def tensor_parallel_group() -> TensorParallelGroup:
    return _GROUP


def pipeline_stage() -> PipelineStage:
    return _STAGE


def set_parallel_state(group: TensorParallelGroup, stage: PipelineStage) -> None:
    """Called once per worker process before its model is built."""
    global _GROUP, _STAGE
    _GROUP, _STAGE = group, stage


def set_tensor_parallel_group(group: TensorParallelGroup) -> None:
    set_parallel_state(group, _STAGE)
