"""A worker host's worker processes and what ends them (for ``entrypoints/headless``).

The agent hands each rank's connection to the leader to a ``remote_entry`` process and
then watches two things: the node link (the leader's clean stop, its abort when the
engine failed, or its end: the leader is gone) and its workers' exits. A worker that
exits 0 did so because the leader told it to (or left it): the link says which. A
worker that dies otherwise is reported to the leader on the link (its ``NodeWatch``
turns the leader unhealthy at once).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import Enum
from multiprocessing.connection import Connection, wait

from octavo.executor.node_channel import ABORT_NODE, STOP_NODE, WORKER_EXITED
from octavo.executor.worker_env import worker_env
from octavo.worker.host_overrides import HostOverrides

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.1  # without pidfds: how often the processes are polled


class Outcome(Enum):
    STOPPED = "the leader stopped the engine"
    LEADER_LOST = "the leader is gone (its link closed without a stop)"
    LEADER_FAILED = "the leader's engine stopped on a failure"
    WORKER_DIED = "a worker of this host died"


@dataclass
class HostWorker:
    rank: int
    process: subprocess.Popen


def start_workers(conns: dict[int, Connection], overrides: HostOverrides) -> list[HostWorker]:
    """One ``remote_entry`` process per rank, each given its connection."""
    workers = []
    for rank, conn in conns.items():
        fd = conn.fileno()
        command = [sys.executable, "-m", "octavo.worker.remote_entry", str(fd), overrides.to_json()]
        process = subprocess.Popen(command, pass_fds=(fd,), env=worker_env())
        conn.close()  # the worker holds it now
        workers.append(HostWorker(rank, process))
    return workers


def supervise(link: Connection, workers: list[HostWorker]) -> Outcome:
    """Wait until the leader stops the engine, the leader is gone, or a worker dies."""
    pidfds = _pidfds(workers)
    try:
        return _watch(link, workers, pidfds)
    finally:
        for fd in pidfds:
            os.close(fd)


def _watch(link: Connection, workers: list[HostWorker], pidfds: dict[int, int]) -> Outcome:
    watched = {worker.process.pid: worker for worker in workers}
    while True:
        sentinels = [fd for fd, pid in pidfds.items() if pid in watched]
        ready = wait([link, *sentinels], None if pidfds else POLL_SECONDS)
        if link in ready:
            return _read_link(link)
        for worker in [w for w in watched.values() if w.process.poll() is not None]:
            del watched[worker.process.pid]
            code = worker.process.returncode
            if code != 0:  # exit 0: stopped by the leader, whose link tells why
                return _report_exit(link, worker, code)


def stop_workers(workers: list[HostWorker], grace: float) -> None:
    """Wait up to ``grace`` seconds for the workers to exit (after the leader's stop);
    kill the rest."""
    deadline = time.monotonic() + grace
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
    kill_workers(workers)


def kill_workers(workers: list[HostWorker]) -> None:
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.kill()
        worker.process.wait()


def _read_link(link: Connection) -> Outcome:
    try:
        message = link.recv()
    except (EOFError, OSError):
        return Outcome.LEADER_LOST
    if message == STOP_NODE:
        return Outcome.STOPPED
    if isinstance(message, tuple) and message[:1] == (ABORT_NODE,):
        logger.error("the leader's engine stopped: %s", message[1])
        return Outcome.LEADER_FAILED
    logger.error("the leader sent %r on the node link; treating it as lost", message)
    return Outcome.LEADER_LOST


def _report_exit(link: Connection, worker: HostWorker, code: int) -> Outcome:
    logger.error("worker %d (pid %d) exited with code %d", worker.rank, worker.process.pid, code)
    with contextlib.suppress(OSError):
        link.send((WORKER_EXITED, worker.rank, code))
    return Outcome.WORKER_DIED


def _pidfds(workers: list[HostWorker]) -> dict[int, int]:
    """A pidfd (readable once the process exits) per worker, by fd; empty where the
    system has none (the workers are polled instead)."""
    try:
        return {os.pidfd_open(worker.process.pid): worker.process.pid for worker in workers}
    except (AttributeError, OSError):
        return {}
