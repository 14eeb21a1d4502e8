"""The seam between the engine core and the workers that run the model.

The engine core talks to an ``Executor`` only: it sizes and allocates the KV cache
through it, hands over each step's ``SchedulerOutput`` and gets the sampled tokens back.
``UniProcExecutor`` runs the one worker in this process; ``MultiprocExecutor``
(``multiproc_executor.py``) runs one worker process per tensor/pipeline-parallel rank,
on this host or, with ``--nnodes``, some on worker hosts.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Protocol

from octavo.distributed.node_layout import DEFAULT_NODE_JOIN_TIMEOUT, NodeLayout
from octavo.executor.step_timeout import DEFAULT_EXECUTE_MODEL_TIMEOUT
from octavo.kv_transfer.block_io import BlockPayload, KVLayout, join_shards, shard_of
from octavo.outputs import ModelRunnerOutput
from octavo.scheduler.output import SchedulerOutput
from octavo.worker.worker import KVBudget, Worker, WorkerConfig


class Executor(Protocol):
    def num_available_blocks(self, budget: KVBudget) -> int:
        """KV blocks that fit on every worker (the smallest of the ranks' answers)."""
        ...

    def initialize_cache(self, num_blocks: int) -> None: ...

    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput: ...

    def check_health(self) -> None:
        """Raise if a worker is gone (called between steps while idle)."""
        ...

    def on_worker_death(self, listener: Callable[[str], None]) -> None:
        """Call ``listener`` (on another thread) with a description the moment a worker
        dies, before any step or health check notices."""
        ...

    def shutdown(self) -> None: ...

    def kv_layout(self) -> KVLayout:
        """The whole KV cache's layout for P/D transfer; ValueError if it cannot move."""
        ...

    def export_kv_blocks(self, block_ids: list[int]) -> BlockPayload:
        """Copies of ``block_ids`` on the host, every rank's layers and heads joined."""
        ...

    def import_kv_blocks(self, block_ids: list[int], payload: BlockPayload) -> None:
        """Write ``payload`` into ``block_ids``, each rank its own layers and heads."""
        ...


class UniProcExecutor:
    """One worker, called directly."""

    def __init__(self, spec: WorkerConfig) -> None:
        self.worker = Worker(spec)

    def num_available_blocks(self, budget: KVBudget) -> int:
        return self.worker.num_available_blocks(budget)

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(step)

    def execute_model_overlapped(self, step: SchedulerOutput) -> ModelRunnerOutput:
        """Async scheduling: launch ``step``; the previously launched step's output."""
        return self.worker.execute_model_overlapped(step)

    def discard_in_flight(self) -> None:
        """Forget a launched step after a failure (its requests are failed)."""
        if self.worker.runner is not None:
            self.worker.runner.in_flight = None

    def check_health(self) -> None:
        pass  # the worker is this process

    def on_worker_death(self, listener: Callable[[str], None]) -> None:
        pass  # the worker is this process: it cannot die alone

    def shutdown(self) -> None:
        self.worker.runner = None
        self.worker.release_host_heap()
        gc.unfreeze()  # what the decode graphs' capture froze is collectable again

    def kv_layout(self) -> KVLayout:
        return self.worker.kv_layout()

    def export_kv_blocks(self, block_ids: list[int]) -> BlockPayload:
        layers = self.worker.export_kv_blocks(block_ids)
        shards = [(self.worker.kv_shard(), layers)]
        return join_shards(shards, self.worker.kv_layout(), len(block_ids))

    def import_kv_blocks(self, block_ids: list[int], payload: BlockPayload) -> None:
        payload.check(self.worker.kv_layout(), len(block_ids))
        self.worker.import_kv_blocks(block_ids, shard_of(payload, self.worker.kv_shard()))


def create_executor(
    spec: WorkerConfig,
    layout: NodeLayout,
    join_timeout: float = DEFAULT_NODE_JOIN_TIMEOUT,
    execute_model_timeout: float = DEFAULT_EXECUTE_MODEL_TIMEOUT,
) -> Executor:
    """The in-process executor for one rank, worker processes for more (on this host,
    and across hosts with ``layout.nnodes > 1``: the worker hosts have ``join_timeout``
    seconds to join; every rank must finish a step within ``execute_model_timeout``)."""
    if layout.world_size == 1:
        return UniProcExecutor(spec)
    from octavo.executor.multiproc_executor import MultiprocExecutor

    return MultiprocExecutor(spec, layout, join_timeout, execute_model_timeout)
