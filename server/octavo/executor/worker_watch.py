"""Noticing a worker process's death the moment it happens, not at the next step.

A ``WorkerWatch`` thread waits on every worker's process file descriptor (``pidfd``,
readable once the process has exited; it does not reap the process, so ``Popen.poll``
still reports the exit code). The first exit that is not part of a shutdown is reported
once to the listener, on the watch thread: the engine core then tells the server at
once, so ``/health`` turns 503 while the engine is still waiting for the other workers.
Where ``os.pidfd_open`` is missing the thread polls the processes instead.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from multiprocessing.connection import wait

from octavo.executor.first_event_watch import FirstEventWatch

POLL_SECONDS = 0.1  # without pidfds: how often the processes are polled

DeathListener = Callable[[int], None]  # called with the index of the worker that exited


class WorkerWatch(FirstEventWatch[int]):
    thread_name = "octavo-worker-watch"

    def __init__(self, processes: list[subprocess.Popen]) -> None:
        super().__init__()
        self._processes = processes
        self.start()

    def on_death(self, listener: DeathListener) -> None:
        """Call ``listener`` when a worker exits (at once if one already has)."""
        self.on_event(listener)

    def _wait_for(self, wake_fd: int) -> int | None:
        """The index of the first worker to exit, or None once stopped."""
        try:
            fds = [os.pidfd_open(process.pid) for process in self._processes]
        except (AttributeError, OSError):  # no pidfds here (or a worker already reaped)
            return self._poll_for_an_exit()
        try:
            ready = wait([wake_fd, *fds])
            return None if wake_fd in ready else fds.index(ready[0])
        finally:
            for fd in fds:
                os.close(fd)

    def _poll_for_an_exit(self) -> int | None:
        while not self._stopping.wait(POLL_SECONDS):
            for index, process in enumerate(self._processes):
                if process.poll() is not None:
                    return index
        return None
