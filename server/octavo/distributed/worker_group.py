"""Joining the workers' process group: one ``torch.distributed`` world of N×M ranks.

Each worker calls ``join_process_group`` once, before it builds its model: gloo on CPU,
NCCL on GPU, rendezvous over TCP (on loopback on one host, the executor picks the port;
at the leader's ``master_port + 1`` across hosts), through a store that rank 0 binds to
that address only (``rendezvous_store``). Every rank creates every stage's
tensor-parallel group (``new_group`` is collective), keeps its own, and records its place
in ``parallel_state``. The shared-memory all-reduce joins a group only when all its ranks
are on one host.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from octavo.distributed.node_layout import NodeLayout
from octavo.distributed.parallel_state import (
    PipelineStage,
    TensorParallelGroup,
    set_parallel_state,
)
from octavo.distributed.rendezvous_store import open_store
from octavo.distributed.shm_all_reduce import create_shared_all_reduce

logger = logging.getLogger(__name__)

# A collective waits this long for a missing peer before failing. The executor notices a
# dead worker long before (its pipe closes); this only bounds a worker that is left behind.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


@dataclass(frozen=True)
class Placement:
    """Where one worker sits: its global rank in a world of ``tp × pp`` over ``nnodes``."""

    rank: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    nnodes: int = 1

    @property
    def layout(self) -> NodeLayout:
        return NodeLayout(self.tensor_parallel_size, self.pipeline_parallel_size, self.nnodes)

    @property
    def local_rank(self) -> int:
        """The rank's index on its host (its GPU there)."""
        return self.layout.local_rank(self.rank)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def tensor_rank(self) -> int:
        return self.rank % self.tensor_parallel_size

    @property
    def stage(self) -> int:
        return self.rank // self.tensor_parallel_size

    @property
    def is_driver(self) -> bool:
        """The rank that samples: tensor rank 0 of the last stage."""
        return self.tensor_rank == 0 and self.stage == self.pipeline_parallel_size - 1


def join_process_group(
    placement: Placement, init_method: str, backend: str, session: str = ""
) -> None:
    """Join the world, build the groups, and (CPU) the shared-memory all-reduce named after
    ``session`` (unique per engine)."""
    store = open_store(
        init_method,
        placement.rank,
        placement.world_size,
        COLLECTIVE_TIMEOUT,
        close_listener=backend == "gloo",  # NCCL meets over the store later, lazily
    )
    dist.init_process_group(
        backend,
        store=store,
        rank=placement.rank,
        world_size=placement.world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    tp, pp = placement.tensor_parallel_size, placement.pipeline_parallel_size
    groups = [dist.new_group(list(range(s * tp, (s + 1) * tp))) for s in range(pp)]
    stage = placement.stage
    shared = _shared_memory(placement, backend, session, groups[stage])
    group = TensorParallelGroup(placement.tensor_rank, tp, groups[stage], stage * tp, shared)
    set_parallel_state(group, PipelineStage(stage, pp, placement.tensor_rank, tp))


def _shared_memory(placement: Placement, backend: str, session: str, group: Any) -> Any:
    """The CPU ranks' shared-memory all-reduce, when the whole group is on this host."""
    tp, stage = placement.tensor_parallel_size, placement.stage
    if backend != "gloo" or tp == 1:
        return None
    if not placement.layout.tensor_group_is_local:
        if placement.tensor_rank == 0:
            logger.info(
                "stage %d's tensor-parallel group spans hosts: its all-reduce runs over gloo", stage
            )
        return None
    return create_shared_all_reduce(
        f"{session}-stage{stage}", placement.tensor_rank, tp, group, stage * tp
    )


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
