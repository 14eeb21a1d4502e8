"""``octavo serve --headless``: a worker host of a multi-node engine (``--nnodes``).

No API server and no engine core run here: this small agent resolves the model on this
host (downloading it if need be), joins the leader at ``--master-addr:--master-port``
(retrying while the leader's name does not resolve or it does not listen yet, for up to
``--node-join-timeout`` seconds), and starts this host's worker processes, ranks
``[R*L, (R+1)*L)``, each connected to the leader's engine core, which drives them.

Exit codes: 0 after the leader's clean stop (or SIGTERM/SIGINT here); 2 when the leader
vanished, its engine failed (it lost another host, or could not load), or a worker of
this host died (this host's other workers are stopped first); 1 when ``OCTAVO_NODE_KEY``
is not set, or the leader could not be reached in time or refused this host (layouts
differ).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

from octavo.config import EngineArgs
from octavo.distributed.node_layout import NodeLayout, rank_span
from octavo.executor.host_workers import (
    Outcome,
    kill_workers,
    start_workers,
    stop_workers,
    supervise,
)
from octavo.executor.node_channel import (
    NODE_LINK,
    RANK_LINK,
    NodeChannelError,
    connect_to_leader,
    hello,
    require_node_key,
)
from octavo.worker.host_overrides import HostOverrides

logger = logging.getLogger(__name__)

STOPPED_EXIT_CODE = 0
JOIN_FAILED_EXIT_CODE = 1
LOST_EXIT_CODE = 2
STOP_GRACE_SECONDS = 10.0  # after the leader's stop, the workers' time to exit


class Terminated(BaseException):
    """SIGTERM or SIGINT arrived: stop this host's workers and exit 0."""


def run_headless(args: EngineArgs) -> int:
    """Run this host's share of the engine until the leader stops it; the exit code."""
    layout = NodeLayout.of(args)
    logger.info(
        "headless worker host: node %d of %d (%s); leader %s:%d",
        layout.node_rank,
        layout.nnodes,
        rank_span(layout.ranks_on(layout.node_rank)),
        layout.master_addr,
        layout.master_port,
    )
    with _signals_terminate():
        try:
            require_node_key(layout.nnodes)  # before anything is downloaded or loaded
            overrides = host_overrides(args, layout)
            link, conns = join_leader(layout, args.node_join_timeout)
        except NodeChannelError as error:
            logger.error("%s", error)
            return JOIN_FAILED_EXIT_CODE
        except Terminated:
            return STOPPED_EXIT_CODE
        return _serve(link, start_workers(conns, overrides))


def host_overrides(args: EngineArgs, layout: NodeLayout) -> HostOverrides:
    """This host's model folder, device and threads; ValueError if its GPUs cannot hold
    its ranks."""
    from octavo.distributed.parallel_config import ParallelConfig
    from octavo.engine.device import select_device
    from octavo.kernels.cpu_count import default_threads
    from octavo.model_executor.model_config import ModelConfig
    from octavo.model_executor.model_folders import resolve_model_folder

    folder = resolve_model_folder(args.model, args.revision)
    device = select_device(args.device)
    parallel = ParallelConfig(
        layout.tensor_parallel_size, layout.pipeline_parallel_size, layout.nnodes
    )
    parallel.check(ModelConfig.from_folder(folder, args.hf_overrides), device)
    threads = args.num_threads or default_threads(layout.local_world_size)
    return HostOverrides(str(folder), str(device), threads, args.tokenizer)


def join_leader(layout: NodeLayout, timeout: float) -> tuple[Connection, dict[int, Connection]]:
    """The node link, then one connection per rank of this host, all accepted."""
    started = time.monotonic()
    deadline = started + timeout
    link = connect_to_leader(layout, hello(layout, NODE_LINK), deadline)
    ranks = layout.ranks_on(layout.node_rank)
    conns = {r: connect_to_leader(layout, hello(layout, RANK_LINK, r), deadline) for r in ranks}
    logger.info(
        "joined the leader %s:%d after %.1f s; starting %s",
        layout.master_addr,
        layout.master_port,
        time.monotonic() - started,
        rank_span(ranks),
    )
    return link, conns


def _serve(link: Connection, workers) -> int:
    try:
        outcome = supervise(link, workers)
    except Terminated:
        logger.info("terminated: stopping this host's workers")
        kill_workers(workers)
        return STOPPED_EXIT_CODE
    if outcome is Outcome.STOPPED:
        logger.info("%s; stopping this host's workers", outcome.value)
        stop_workers(workers, STOP_GRACE_SECONDS)
        return STOPPED_EXIT_CODE
    logger.error("%s; stopping this host's workers", outcome.value)
    kill_workers(workers)
    return LOST_EXIT_CODE


@contextlib.contextmanager
def _signals_terminate() -> Iterator[None]:
    """SIGTERM/SIGINT raise ``Terminated`` in the main thread while inside."""

    def terminate(signum: int, frame) -> None:
        raise Terminated(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, terminate) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
