"""One worker process per tensor/pipeline-parallel rank, driven from the engine core.

The executor starts ``tensor_parallel_size × pipeline_parallel_size`` worker processes
on this node (``worker_process``), each holding a socket-pair pipe to it. Every call is
broadcast: the step is pickled once and sent to every rank, every rank answers, and
the driver's answer (tensor rank 0 of the last stage, the one that samples) is the
step's result. The scheduler and block manager stay in the engine core, once.

Supervision: a worker that exits or whose pipe closes is a ``WorkerDied`` (fatal: the
engine core stops and the server exits non-zero so the pod restarts). A ``WorkerWatch``
reports a worker's exit the moment it happens (``on_worker_death``), so the server turns
unhealthy before the engine has stopped the other workers; ``check_health`` notices one
between steps too. An error reported by some ranks while others never
answer (stuck in a collective) is fatal as well; the same error from every rank is an
ordinary step failure. A step that does not come back within ``execute_model_timeout``
seconds (``step_timeout``) is fatal too: a rank is wedged (a stuck collective, a stopped
process or host). Whatever the fatal cause, every local worker is killed at once (a
survivor may be stuck mid-step, waiting for the lost rank, and never read a stop) and
the worker hosts are told the engine failed.
``shutdown`` (or the executor being collected) stops every worker, killing what does
not stop in time.

Across hosts (``--nnodes``): this host runs the ranks of node 0; the others run on
worker hosts (``octavo serve --headless``) that join over TCP (``node_rendezvous``), and
each remote rank is one more connection here, driven the same way. A ``NodeWatch``
reports a worker host's loss as the ``WorkerWatch`` reports a local worker's exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import secrets
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from octavo.distributed.node_layout import DEFAULT_NODE_JOIN_TIMEOUT, NodeLayout
from octavo.distributed.worker_group import Placement
from octavo.executor.forked_workers import start_worker_process
from octavo.executor.node_rendezvous import NodeRendezvous
from octavo.executor.node_watch import NodeWatch
from octavo.executor.remote_worker import NodeLink, RemoteWorkerHandle
from octavo.executor.step_timeout import (
    DEFAULT_EXECUTE_MODEL_TIMEOUT,
    bound_sends,
    overdue_message,
)
from octavo.executor.worker_watch import WorkerWatch
from octavo.kv_transfer.block_io import (
    BlockPayload,
    KVLayout,
    KVShard,
    PackedTensor,
    join_shards,
    shard_of,
)
from octavo.outputs import ModelRunnerOutput
from octavo.scheduler.output import SchedulerOutput
from octavo.worker.worker import STOP_WORKER, KVBudget, WorkerConfig

logger = logging.getLogger(__name__)

PEER_ERROR_GRACE_SECONDS = 10.0  # after one rank reports an error, wait this long for the rest
STOP_GRACE_SECONDS = 10.0


class WorkerDied(RuntimeError):
    """A worker process is gone (or stuck): the executor cannot run steps any more."""


class WorkerCallFailed(RuntimeError):
    """Every rank raised the same kind of error in a call; the workers are still usable."""


class WorkerOutOfMemory(WorkerCallFailed, MemoryError):
    """A rank ran out of memory: an engine error, never one request's fault."""


class WorkerHandle:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = start_worker_process(theirs)
        self.conn = Connection(ours.detach())

    def exit_description(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=1.0)
        code = self.process.returncode
        how = "is not answering" if code is None else f"exited with code {code}"
        return f"worker {self.rank} (pid {self.process.pid}) {how}"

    def wait_stopped(self, deadline: float) -> None:
        """Wait for the process to exit after its stop, killing it at ``deadline``."""
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("worker %d did not stop in time; killing it", self.rank)
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL the process (a stopped one too) unless it has exited."""
        if self.process.poll() is None:
            self.process.kill()


Handle = WorkerHandle | RemoteWorkerHandle


class MultiprocExecutor:
    def __init__(
        self,
        spec: WorkerConfig,
        layout: NodeLayout,
        join_timeout: float = DEFAULT_NODE_JOIN_TIMEOUT,
        execute_model_timeout: float = DEFAULT_EXECUTE_MODEL_TIMEOUT,
    ) -> None:
        tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
        self.placements = [Placement(r, tp, pp, layout.nnodes) for r in range(layout.world_size)]
        self.driver = next(p.rank for p in self.placements if p.is_driver)
        self.local_workers = [WorkerHandle(rank) for rank in layout.ranks_on(0)]
        self.workers: list[Handle] = list(self.local_workers)  # every rank, in rank order
        self.links: list[NodeLink] = []  # the worker hosts' links (multi-node)
        self.execute_model_timeout = execute_model_timeout
        self._broken: str | None = None
        self._death_listener: Callable[[str], None] | None = None
        self._death_reported = threading.Lock()  # held once the death was reported
        self._watch = WorkerWatch([worker.process for worker in self.local_workers])
        self._watch.on_death(_weak_listener(self, MultiprocExecutor._worker_exited))
        self._node_watch: NodeWatch | None = None
        self._watches: list[WorkerWatch | NodeWatch] = [self._watch]
        self._finalizer = weakref.finalize(
            self, _stop_workers, self.workers, self.links, self._watches
        )
        init_method = layout.torch_init_method if layout.is_multi_node else _loopback_init()
        session = f"{os.getpid()}-{secrets.token_hex(4)}"  # names this engine's shared memory
        logger.info(
            "starting %d workers (tensor parallel %d × pipeline parallel %d) on %d "
            "node(s), %d here",
            layout.world_size,
            tp,
            pp,
            layout.nnodes,
            len(self.local_workers),
        )
        try:
            if layout.is_multi_node:
                self._join_or_kill_local(layout, join_timeout)
            for worker in self.workers:
                bound_sends(worker.conn, execute_model_timeout)
                worker.conn.send((spec, self.placements[worker.rank], init_method, session))
            self._collect()
        except BaseException as error:
            self._abort_links(f"the engine failed to load: {error}")
            self.shutdown()
            raise

    def _join_or_kill_local(self, layout: NodeLayout, timeout: float) -> None:
        """``_join``; when the hosts never meet, the local workers (still importing, given
        no rank, holding nothing) are killed at once rather than waited for."""
        try:
            self._join(layout, timeout)
        except BaseException:
            for worker in self.local_workers:
                worker.kill()
            raise

    def _join(self, layout: NodeLayout, timeout: float) -> None:
        """Wait for the worker hosts' ranks; then watch their links."""
        joined = NodeRendezvous(layout, timeout).gather()
        self.links.extend(joined.links)
        self.workers.extend(joined.workers)
        self.workers.sort(key=lambda worker: worker.rank)
        self._node_watch = NodeWatch(self.links)
        self._watches.append(self._node_watch)
        self._node_watch.on_loss(_weak_listener(self, MultiprocExecutor._report_death))

    # ----- the Executor interface ----------------------------------------------------------
    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput:
        return self.call("execute_model", step, timeout=self.execute_model_timeout)[self.driver]

    def num_available_blocks(self, budget: KVBudget) -> int:
        return min(self.call("num_available_blocks", budget))

    def initialize_cache(self, num_blocks: int) -> None:
        self.call("initialize_cache", num_blocks)

    def check_health(self) -> None:
        """Raise ``WorkerDied`` if any worker has exited or a worker host is lost."""
        if self._broken is None:
            dead = [w for w in self.local_workers if w.process.poll() is not None]
            if dead:
                self._fail(dead[0].exit_description())
            lost = self._node_watch.lost if self._node_watch is not None else None
            if lost is not None:
                self._fail(lost)
        if self._broken is not None:
            raise WorkerDied(self._broken)

    def on_worker_death(self, listener: Callable[[str], None]) -> None:
        self._death_listener = listener
        if self._broken is not None:
            self._report_death(self._broken)

    def shutdown(self) -> None:
        self._finalizer()

    # ----- P/D KV transfer (between steps, on the core loop thread) --------------------------
    _kv_transfer: tuple[KVLayout, list[KVShard]] | None = None  # asked once

    def kv_layout(self) -> KVLayout:
        return self._kv_transfer_shape()[0]

    def export_kv_blocks(self, block_ids: list[int]) -> BlockPayload:
        layout, shards = self._kv_transfer_shape()
        packed = self.call("export_kv_blocks_packed", block_ids)
        slices = [[layer.unpack() for layer in rank_layers] for rank_layers in packed]
        return join_shards(list(zip(shards, slices, strict=True)), layout, len(block_ids))

    def import_kv_blocks(self, block_ids: list[int], payload: BlockPayload) -> None:
        layout, shards = self._kv_transfer_shape()
        payload.check(layout, len(block_ids))
        per_rank = [
            (block_ids, [PackedTensor.pack(layer) for layer in shard_of(payload, shard)])
            for shard in shards
        ]
        self._call_each("import_kv_blocks_packed", per_rank)

    def _kv_transfer_shape(self) -> tuple[KVLayout, list[KVShard]]:
        """The cache's layout and each rank's part of it (ValueError if it cannot move)."""
        if self._kv_transfer is None:
            layout = self.call("kv_layout")[self.driver]
            self._kv_transfer = (layout, self.call("kv_shard"))
        return self._kv_transfer

    def _call_each(self, method: str, per_rank: list[tuple[Any, ...]]) -> list[Any]:
        """``call`` with each rank's own arguments (``per_rank`` in rank order)."""
        self.check_health()
        for worker in self.workers:
            message = pickle.dumps((method, per_rank[worker.rank]), pickle.HIGHEST_PROTOCOL)
            try:
                worker.conn.send_bytes(message)
            except OSError:
                self._fail(worker.exit_description())
        return self._collect()

    def _worker_exited(self, index: int) -> None:
        """On the watch thread: a worker exited while the executor was running."""
        self._report_death(self.local_workers[index].exit_description())

    def _report_death(self, reason: str) -> None:
        """Tell the listener, once, that the workers cannot go on."""
        if self._death_listener is not None and self._death_reported.acquire(blocking=False):
            self._death_listener(reason)

    # ----- calls ---------------------------------------------------------------------------
    def call(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Run ``worker.method(*args)`` on every rank; their results in rank order. Every
        rank must answer within ``timeout`` seconds (None: no bound)."""
        self.check_health()
        message = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
        for worker in self.workers:
            try:
                worker.conn.send_bytes(message)
            except OSError:
                self._fail(worker.exit_description())
        return self._collect(timeout)

    def _collect(self, timeout: float | None = None) -> list[Any]:
        results: list[Any] = [None] * len(self.workers)
        pending = {worker.conn: worker for worker in self.workers}
        errors: list[tuple[int, str, str]] = []
        step_deadline = None if timeout is None else time.monotonic() + timeout
        deadline: float | None = None  # once a rank reported an error: the others' grace
        while pending:
            ready = wait(list(pending), _seconds_until(deadline, step_deadline))
            if not ready:
                ranks = sorted(w.rank for w in pending.values())
                self._fail(_silence(errors, ranks, timeout))
            for conn in ready:
                worker = pending.pop(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    self._fail(worker.exit_description())
                if status == "ok":
                    results[worker.rank] = value
                else:
                    errors.append((worker.rank, *value))
                    deadline = deadline or time.monotonic() + PEER_ERROR_GRACE_SECONDS
        if errors:
            _raise_reported(errors)
        return results

    def _abort_links(self, reason: str) -> None:
        """Tell the worker hosts the engine stops on a failure (not a clean stop)."""
        for watch in self._watches:
            watch.stop()  # the links closing is expected now
        for link in self.links:
            link.abort(reason)

    def _fail(self, reason: str) -> None:
        """The workers cannot go on: kill the local ones at once and raise ``WorkerDied``.

        A survivor of a dead or silent peer may be waiting in a collective for it (a
        shared-memory all-reduce spins, gloo waits out its timeout): a stop message would
        never be read, and its state is lost with the group anyway."""
        self._broken = self._broken or reason
        logger.error("%s; killing every worker", self._broken)
        self._report_death(self._broken)  # before waiting for the others to exit
        self._abort_links(self._broken)
        for worker in self.local_workers:
            worker.kill()
        self.shutdown()
        raise WorkerDied(self._broken)


def _seconds_until(*deadlines: float | None) -> float | None:
    """Seconds to the earliest of the deadlines that are set (None: none is)."""
    set_ones = [deadline for deadline in deadlines if deadline is not None]
    return max(0.0, min(set_ones) - time.monotonic()) if set_ones else None


def _silence(errors: list[tuple[int, str, str]], ranks: list[int], timeout: float | None) -> str:
    """Why ranks that never answered stop the engine."""
    if errors:
        return f"worker {errors[0][0]} failed ({errors[0][1]}) and ranks {ranks} stopped answering"
    return overdue_message(timeout or 0.0, ranks)


def _raise_reported(errors: list[tuple[int, str, str]]) -> None:
    rank, text, trace = errors[0]
    logger.error("worker %d failed:\n%s", rank, trace)
    kind = WorkerOutOfMemory if "OutOfMemoryError" in text or "MemoryError" in text else None
    raise (kind or WorkerCallFailed)(text)


def _weak_listener(executor: MultiprocExecutor, method: Callable[[Any, Any], None]):
    """A watch's listener calling ``method`` on the executor, held weakly (so the executor
    can still be collected)."""
    ref = weakref.ref(executor)

    def listener(what: Any) -> None:
        alive = ref()
        if alive is not None:
            method(alive, what)

    return listener


def _stop_workers(
    workers: list[Handle], links: list[NodeLink], watches: list[WorkerWatch | NodeWatch]
) -> None:
    for watch in watches:
        watch.stop()  # the workers' exits (and the hosts' links closing) are expected now
    for worker in workers:
        with contextlib.suppress(OSError):
            worker.conn.send(STOP_WORKER)
    for link in links:
        link.stop()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for worker in workers:
        worker.wait_stopped(deadline)
        worker.conn.close()


def _loopback_init() -> str:
    """One host's rendezvous: a free loopback port."""
    return f"tcp://127.0.0.1:{_free_port()}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
