"""Which part of a MoE layer's experts this tensor-parallel rank holds.

- Tensor parallel (the default): every expert, and this rank's slice of each expert's
  intermediate dimension (rows of ``w13``'s gate and up halves, columns of ``w2``); the
  ranks' partial outputs are summed by the all-reduce, and the down-projection bias is
  added by rank 0 only.
- Expert parallel (``enable_expert_parallel``, vLLM's flag): ``E / tp`` whole experts
  per rank; a token routed to another rank's expert gets nothing from this rank, and
  the all-reduce sums the ranks' contributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.distributed.parallel_state import TensorParallelGroup


@dataclass(frozen=True)
class ExpertPlacement:
    num_experts: int
    first_expert: int  # global index of this rank's first expert
    num_local_experts: int
    intermediate_size: int  # the checkpoint's, whole
    intermediate_start: int  # this rank's slice of it
    intermediate_shard: int
    adds_down_bias: bool

    @classmethod
    def for_rank(
        cls,
        group: TensorParallelGroup,
        num_experts: int,
        intermediate_size: int,
        expert_parallel: bool,
    ) -> ExpertPlacement:
        if expert_parallel:
            first, last = group.shard(num_experts, "experts (expert parallel)")
            return cls(
                num_experts, first, last - first, intermediate_size, 0, intermediate_size, True
            )
        start, end = group.shard(intermediate_size, "expert intermediate size")
        return cls(
            num_experts, 0, num_experts, intermediate_size, start, end - start, group.rank == 0
        )

    @property
    def local_experts(self) -> range:
        """Global indices of this rank's experts."""
        return range(self.first_expert, self.first_expert + self.num_local_experts)

    @property
    def is_partial(self) -> bool:
        return self.num_local_experts < self.num_experts

    def expert_map(self) -> torch.Tensor | None:
        """Global expert id → local index, ``-1`` for another rank's (None: all are here)."""
        if not self.is_partial:
            return None
        mapping = torch.full((self.num_experts,), -1, dtype=torch.int64)
        mapping[self.local_experts.start : self.local_experts.stop] = torch.arange(
            self.num_local_experts
        )
        return mapping
