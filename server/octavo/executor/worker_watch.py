"""Noticing a worker process's death the moment it happens, not at the next step.

A ``WorkerWatch`` thread waits on every worker's process file descriptor (``pidfd``,
readable once the process has exited; it does not reap the process, so ``Popen.poll``
still reports the exit code). The first exit that is not part of a shutdown is reported
once to the listener, on the watch thread: the engine core then tells the server at
once, so ``/health`` turns 503 while the engine is still waiting for the other workers.
Where ``os.pidfd_open`` is missing the thread polls the processes instead.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable
from multiprocessing.connection import wait

POLL_SECONDS = 0.1  # without pidfds: how often the processes are polled

DeathListener = Callable[[int], None]  # called with the index of the worker that exited


class WorkerWatch:
    def __init__(self, processes: list[subprocess.Popen]) -> None:
        self._processes = processes
        self._listener: DeathListener | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._dead: int | None = None  # the first worker seen dead
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="octavo-worker-watch", daemon=True)
        self._thread.start()

    def on_death(self, listener: DeathListener) -> None:
        """Call ``listener`` when a worker exits (at once if one already has)."""
        with self._lock:
            self._listener, dead = listener, self._dead
        if dead is not None and not self._stopping.is_set():
            listener(dead)

    def stop(self) -> None:
        """Stop watching: the workers' exits from now on are expected."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")

    def _run(self) -> None:
        try:
            index = self._wait_for_an_exit()
        finally:
            for fd in (self._wake_read, self._wake_write):
                with contextlib.suppress(OSError):
                    os.close(fd)
        if index is None or self._stopping.is_set():
            return
        with self._lock:
            self._dead, listener = index, self._listener
        if listener is not None:
            listener(index)

    def _wait_for_an_exit(self) -> int | None:
        """The index of the first worker to exit, or None once stopped."""
        try:
            fds = [os.pidfd_open(process.pid) for process in self._processes]
        except (AttributeError, OSError):  # no pidfds here (or a worker already reaped)
            return self._poll_for_an_exit()
        try:
            ready = wait([self._wake_read, *fds])
            return None if self._wake_read in ready else fds.index(ready[0])
        finally:
            for fd in fds:
                os.close(fd)

    def _poll_for_an_exit(self) -> int | None:
        while not self._stopping.wait(POLL_SECONDS):
            for index, process in enumerate(self._processes):
                if process.poll() is not None:
                    return index
        return None
