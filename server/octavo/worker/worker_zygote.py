"""The worker zygote: imports what a rank needs once, then forks each rank's process.

A rank started as a fresh interpreter (``worker_process``) imports torch and the model code
before it can load a weight: ~1.7 s of CPU each, for every rank of every engine. The zygote
(``python -m octavo.worker.worker_zygote FD``, started by ``executor/forked_workers.py``)
does that once per engine process, single-threaded, and forks a rank in milliseconds; the
forked process then runs ``worker_process.serve`` as a spawned one would.

Control socket ``FD`` (a ``multiprocessing`` connection), engine → zygote: ``(FORK, env)``
followed by the rank's socket as a passed file descriptor; zygote → engine: ``(FORKED,
pid)``, and ``(EXITED, pid, code)`` once a rank has exited (``code`` as ``subprocess``
reports it: negative for a signal). The zygote dies with the engine (``PR_SET_PDEATHSIG``)
and each rank with the zygote, so a killed engine leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import sys
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle

from octavo.stack_dumps import dump_stacks_on_signal
from octavo.worker.worker_process import die_with_parent, serve

FORK = "fork"
FORKED = "forked"
EXITED = "exited"


def main() -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine stops its ranks itself
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dump_stacks_on_signal()  # the forked ranks keep it
    import octavo.worker.worker  # noqa: F401  (torch and the model code: what forks share)

    conn = Connection(int(sys.argv[1]))
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)  # a SIGCHLD wakes the loop below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready = wait([conn, wake_read])
        if wake_read in ready:
            _drain(wake_read)
            _report_exits(conn)
        if conn in ready and not _fork_on_request(conn, (wake_read, wake_write)):
            return


def _fork_on_request(conn: Connection, wake_fds: tuple[int, int]) -> bool:
    """Fork the rank one request asks for; False once the engine's end has closed."""
    try:
        _, env = conn.recv()
        rank_fd = recv_handle(conn)
    except (EOFError, OSError):
        return False
    zygote_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_rank(rank_fd, env, zygote_pid, wake_fds)
    os.close(rank_fd)
    conn.send((FORKED, pid))
    return True


def _run_rank(rank_fd: int, env: dict[str, str], zygote_pid: int, wake_fds) -> None:
    """The forked rank: the engine's environment, then ``serve`` until told to stop."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in wake_fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    die_with_parent(expected_parent=zygote_pid)
    code = _serve_rank(rank_fd)
    os._exit(code)  # never back into the zygote's loop


def _serve_rank(rank_fd: int) -> int:
    """``serve`` and leave the process group; the exit code a spawned rank would have."""
    import traceback

    from octavo.distributed.worker_group import leave_process_group

    code = 0
    try:
        serve(Connection(rank_fd))
    except BaseException:  # as an uncaught error ends a spawned rank: traceback, exit 1
        traceback.print_exc()
        code = 1
    try:
        leave_process_group()
    except BaseException:
        traceback.print_exc()
        code = 1
    return code


def _report_exits(conn: Connection) -> None:
    """Reap every exited rank and tell the engine its exit code."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        try:
            conn.send((EXITED, pid, code))
        except OSError:  # the engine is gone: this process is about to be killed
            return


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


if __name__ == "__main__":
    main()
