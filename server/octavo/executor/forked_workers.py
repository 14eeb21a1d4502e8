"""Starting a rank's worker process: forked from the worker zygote, or spawned.

``OCTAVO_WORKER_MULTIPROC_METHOD`` (vLLM's ``VLLM_WORKER_MULTIPROC_METHOD``) chooses:

- ``fork`` (the default on CPU hosts): one zygote per engine process
  (``worker/worker_zygote.py``) imports torch and the model code once; each rank is forked
  from it in milliseconds. A fresh interpreter per rank costs ~1.7 s of CPU before it
  loads a weight: per rank of every engine started, and per restart.
- ``spawn`` (the default where CUDA devices are visible): each rank is a fresh
  ``python -m octavo.worker.worker_process FD``. A forked rank must never inherit an
  initialized CUDA driver; until forked ranks have been run on a GPU, GPU hosts spawn.

A forked rank is a child of the zygote, not of the engine; ``ForkedWorker`` answers what
the executor asks a ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``kill``,
``returncode``) from the exits the zygote reports. The zygote is started from a thread of
its own that lives as long as the process (``PR_SET_PDEATHSIG`` fires when the thread that
started a process ends), which then reads the zygote's reports.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle

from octavo.executor.worker_env import worker_env
from octavo.worker.worker_zygote import EXITED, FORK, FORKED

METHOD_ENV = "OCTAVO_WORKER_MULTIPROC_METHOD"
METHODS = ("fork", "spawn")
FORK_TIMEOUT_SECONDS = 120.0  # the first fork waits for the zygote's imports
LOST_WITH_ZYGOTE = -signal.SIGKILL  # a rank's exit code when its zygote died first
LOST_POLL_SECONDS = 0.05  # how often a rank of a lost zygote is looked at


def start_worker_process(theirs: socket.socket) -> subprocess.Popen | ForkedWorker:
    """A rank's process serving ``theirs`` (the caller closes its copy afterwards)."""
    method = os.environ.get(METHOD_ENV) or default_method()
    if method not in METHODS:
        raise ValueError(f"{METHOD_ENV}={method!r}: expected one of {', '.join(METHODS)}")
    if method == "fork":
        return zygote().fork(theirs)
    command = [sys.executable, "-m", "octavo.worker.worker_process", str(theirs.fileno())]
    return subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=worker_env())


def default_method() -> str:
    """``fork`` on CPU hosts, ``spawn`` where CUDA devices are visible."""
    import torch

    return "spawn" if torch.cuda.is_available() else "fork"


class ForkedWorker:
    """A rank forked by the zygote, behind the ``subprocess.Popen`` methods the executor uses."""

    def __init__(self, pid: int, zygote: WorkerZygote) -> None:
        self.pid = pid
        self._zygote = zygote

    @property
    def returncode(self) -> int | None:
        return self._zygote.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._zygote.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"octavo worker (pid {self.pid})", timeout or 0.0)
        return code

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class WorkerZygote:
    """The engine's side of the zygote: asks it to fork, and records the exits it reports."""

    def __init__(self) -> None:
        self._conn: Connection | None = None
        self._process: subprocess.Popen | None = None
        self._started = threading.Event()
        self._forked: queue.Queue[int | None] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._changed = threading.Condition()
        self._lost = False  # the zygote is gone: its ranks went with it
        self._fork_lock = threading.Lock()
        threading.Thread(target=self._run, name="octavo-worker-zygote", daemon=True).start()
        self._started.wait()

    def is_alive(self) -> bool:
        return not self._lost and self._process is not None and self._process.poll() is None

    def fork(self, theirs: socket.socket) -> ForkedWorker:
        if self._conn is None:
            raise RuntimeError("the worker zygote could not start")
        with self._fork_lock:
            try:
                self._conn.send((FORK, worker_env()))
                send_handle(self._conn, theirs.fileno(), self._process.pid)
                pid = self._forked.get(timeout=FORK_TIMEOUT_SECONDS)
            except (OSError, queue.Empty):
                pid = None
        if pid is None:
            self._process.kill()  # a late answer must not be taken for the next fork's
            raise RuntimeError("the worker zygote is gone; no worker process was started")
        return ForkedWorker(pid, self)

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            code = self._exits.get(pid)
            if code is None and self._lost and not _running(pid):
                return LOST_WITH_ZYGOTE
            return code

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        """The exit code once ``pid`` has exited; None if it still runs after ``timeout``.
        After the zygote is lost nothing reports exits: the rank is looked at instead."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while (code := self.exit_code(pid)) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                if self._lost:
                    left = LOST_POLL_SECONDS if left is None else min(left, LOST_POLL_SECONDS)
                self._changed.wait(left)
            return code

    def _run(self) -> None:
        """Start the zygote, then read its reports until it is gone (this thread never
        ends before then: the zygote's death signal is tied to it)."""
        try:
            self._start()
        finally:
            self._started.set()
        if self._conn is not None:
            self._read(self._conn)

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-m", "octavo.worker.worker_zygote", str(theirs.fileno())]
        with theirs:
            self._process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=worker_env())
        self._conn = Connection(ours.detach())

    def _read(self, conn: Connection) -> None:
        try:
            while True:
                kind, *rest = conn.recv()
                if kind == FORKED:
                    self._forked.put(rest[0])
                elif kind == EXITED:
                    with self._changed:
                        self._exits[rest[0]] = rest[1]
                        self._changed.notify_all()
        except (EOFError, OSError):
            pass
        with self._changed:
            self._lost = True
            self._changed.notify_all()
        self._forked.put(None)  # a fork waiting for an answer gets none
        if self._process is not None:
            self._process.wait()


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie that nobody reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


_zygote: WorkerZygote | None = None
_zygote_lock = threading.Lock()


def zygote() -> WorkerZygote:
    """This process's zygote, started on first use (and again if it died)."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.is_alive():
            _zygote = WorkerZygote()
        return _zygote
