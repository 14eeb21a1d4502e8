"""What a test that waited too long for a process shows: every Octavo process's stacks
(``octavo.stack_dumps``: SIGUSR1) and the end of its log without the /health lines."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import psutil

from octavo.stack_dumps import STACK_DUMP_SIGNAL

DUMP_WAIT_SECONDS = 2.0
TAIL_LINES = 120


def dump_stacks(pid: int) -> None:
    """Ask ``pid`` and its descendants that handle the signal (the others would die of it)
    to print their stacks into their logs; wait for them to be written."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        if catches(process.pid, STACK_DUMP_SIGNAL):
            with contextlib.suppress(psutil.NoSuchProcess):  # it exited meanwhile
                process.send_signal(STACK_DUMP_SIGNAL)
    time.sleep(DUMP_WAIT_SECONDS)


def catches(pid: int, signum: signal.Signals) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (``SigCgt`` in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signum - 1) & 1)


def log_tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``log``, the access log's /health probes left out."""
    kept = [line for line in log.read_text(errors="replace").splitlines() if "/health" not in line]
    return "\n".join(kept[-lines:])


def stuck(pid: int, log: Path, what: str) -> str:
    """``what``, then the stacks and the log's tail of the process ``pid`` that overran."""
    dump_stacks(pid)
    return f"{what}; its log's end, with every thread's stack:\n{log_tail(log)}"
