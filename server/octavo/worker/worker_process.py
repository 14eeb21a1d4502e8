"""A worker process: one tensor/pipeline-parallel rank, driven by the executor over a pipe.

Started by ``MultiprocExecutor`` as ``python -m octavo.worker.worker_process FD`` with one
end of a socket pair as file descriptor ``FD``. It reads calls (``(method, args)``,
pickled) and answers each with ``("ok", result)`` or ``("error", text)``. It stops on
``"stop"``, and also when its parent goes away: the pipe closes (end of file) and,
on Linux, the kernel kills it with its parent (``PR_SET_PDEATHSIG``), so a killed
engine never leaves workers behind. SIGINT/SIGTERM are ignored: the server drains
first and then stops the engine, which stops its workers.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from octavo.logging_format import configure_logging
from octavo.stack_dumps import dump_stacks_on_signal

if TYPE_CHECKING:
    from octavo.worker.worker import WorkerConfig

LOG_FORMAT = "%(levelname)s:     [worker %(rank)s] %(name)s: %(message)s"


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux only).
    ``expected_parent``: the parent's pid, where this process was forked (not spawned)."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    parent = os.getppid()
    if parent == 1 or expected_parent not in (None, parent):  # the parent died before the
        os._exit(1)  # call: nobody would kill us


def serve(conn: Connection, adapt: Callable[[WorkerConfig], WorkerConfig] | None = None) -> None:
    """Build the worker from the first message (its config passed through ``adapt``: a
    worker host's own paths and threads), then answer calls until told to stop."""
    from octavo.worker.worker import STOP_WORKER, Worker

    try:
        first = conn.recv()
    except (EOFError, OSError):  # the executor is gone before it gave this worker a rank
        return
    if first == STOP_WORKER:  # stopped before it was given a rank (worker hosts never joined)
        return
    spec, placement, init_method, session = first
    if adapt is not None:
        spec = adapt(spec)
    _configure_logging(placement.rank)
    workers: list[Worker] = []
    _answer(conn, lambda: workers.append(Worker(spec, placement, init_method, session)))
    if not workers:
        return
    worker = workers[0]
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the executor is gone
            return
        if message == STOP_WORKER:
            return
        method, args = message
        _answer(conn, partial(getattr(worker, method), *args))


def _answer(conn: Connection, call) -> Any:
    """Run ``call`` and send its result or its error; returns the result (None on error)."""
    try:
        result = call()
    except Exception as error:  # reported to the executor, which decides
        logging.getLogger(__name__).exception("worker call failed")
        text = f"{type(error).__name__}: {error}"
        conn.send(("error", (text, traceback.format_exc())))
        return None
    conn.send(("ok", result))
    return result


def _configure_logging(rank: int) -> None:
    configure_logging(logging.INFO, LOG_FORMAT.replace("%(rank)s", str(rank)), rank=rank)


def main() -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dump_stacks_on_signal()
    conn = Connection(int(sys.argv[1]))
    try:
        serve(conn)
    finally:
        from octavo.distributed.worker_group import leave_process_group

        leave_process_group()


if __name__ == "__main__":
    main()
