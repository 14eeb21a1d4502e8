"""The compile processes: a zygote that imported xgrammar forks them, each compiles one
constraint at a time over a pipe and can be killed (SIGKILL: the C++ compile cannot be
interrupted otherwise).

The zygote (``compile_worker.zygote_main``) imports xgrammar and loads the vocabulary once
(seconds), so a compile process forks from it in milliseconds and shares its memory. It is
a plain subprocess that imports what compiling needs, not the server
(``compile_worker.start_zygote``); one per vocabulary and process, killed at exit (and it
stops by itself when this process's end of its socket closes); its compile processes die
with it.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle

from octavo.structured_output.compile_worker import (
    FORK,
    READY,
    Compiled,
    Invalid,
    Vocabulary,
    start_zygote,
)
from octavo.structured_output.params import StructuredOutputsParams

STARTUP_TIMEOUT_SECONDS = 120.0  # the first start imports xgrammar in the zygote
POLL_SECONDS = 0.05  # how soon a running compile notices that its caller gave up


class CompilerUnavailable(RuntimeError):
    """No compile process could be started, or the pool is shut down."""


class ProcessLost(Exception):
    """The compile process died, or was killed because its caller gave up."""


class Zygote:
    """The process that forks compile processes (``compile_worker.zygote_main``); it is
    started at once, ``fork`` waits until it is ready (seconds, the first time)."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._conn, theirs = multiprocessing.Pipe()  # a socket pair: file descriptors pass
        try:
            self._process = start_zygote(theirs)
        finally:
            theirs.close()
        self._lock = threading.Lock()  # one fork at a time; the first waits for READY
        self._ready = False
        sender = threading.Thread(
            target=self._send, args=(vocabulary,), name="octavo-grammar-zygote", daemon=True
        )
        sender.start()  # blocks until the zygote reads it, after its imports

    def _send(self, vocabulary: Vocabulary) -> None:
        with contextlib.suppress(OSError, ValueError):  # it died or was killed: fork says so
            self._conn.send(vocabulary)

    def is_alive(self) -> bool:
        return self._process.poll() is None

    def _wait_ready(self) -> None:
        if not self._ready:
            deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
            while not self._conn.poll(POLL_SECONDS):  # kill() from another thread ends it
                if time.monotonic() > deadline:
                    self._process.kill()  # the next start makes a new one
                    raise CompilerUnavailable("the grammar compiler did not start in time")
            if self._conn.recv() != READY:
                raise CompilerUnavailable("the grammar compiler did not start")
            self._ready = True

    def fork(self) -> CompileProcess:
        ours, theirs = multiprocessing.Pipe()
        try:
            with self._lock:
                self._wait_ready()
                self._conn.send(FORK)
                send_handle(self._conn, theirs.fileno(), self._process.pid)
                pid = self._conn.recv()
        except CompilerUnavailable:
            ours.close()
            raise
        except (EOFError, OSError) as error:
            ours.close()
            raise CompilerUnavailable("the grammar compiler stopped") from error
        finally:
            theirs.close()
        return CompileProcess(ours, pid)

    def kill(self) -> None:
        self._process.kill()
        self._process.wait(5)
        self._conn.close()


class CompileProcess:
    """One compile process (forked by the zygote) and its pipe; one thread uses it."""

    def __init__(self, conn: Connection, pid: int) -> None:
        self._conn, self.pid = conn, pid
        self._pidfd = _pidfd(pid)
        self._kill_lock, self._killed = threading.Lock(), False

    def send(self, params: StructuredOutputsParams) -> None:
        """Start compiling ``params``; ``ProcessLost`` (killed) if the process is gone."""
        try:
            self._conn.send(params)
        except (OSError, ValueError):
            self.kill()
            raise ProcessLost from None

    def wait(self, seconds: float, abandoned: threading.Event) -> Compiled | Invalid | None:
        """The answer if it comes within ``seconds``, ``None`` if it is still compiling;
        ``ProcessLost`` (the process is killed) if it died or ``abandoned`` was set."""
        deadline = time.monotonic() + seconds
        try:
            while not self._conn.poll(max(0.0, min(POLL_SECONDS, deadline - time.monotonic()))):
                if abandoned.is_set():
                    break
                if time.monotonic() >= deadline:
                    return None
            else:
                answer = self._conn.recv()
                if isinstance(answer, Compiled | Invalid):
                    return answer
        except (EOFError, OSError):
            pass
        self.kill()
        raise ProcessLost

    def kill(self) -> None:
        """SIGKILL (through a pidfd where Linux has them: never another process), once:
        the pool's shutdown and its lane's thread may both call it, and a second signal
        by pid could reach a process that reused it."""
        with self._kill_lock:
            if self._killed:
                return
            self._killed = True
            with contextlib.suppress(OSError):
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                else:
                    os.kill(self.pid, signal.SIGKILL)
            self._conn.close()
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None


_ZYGOTES: dict[str, Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def shared_zygote(vocabulary: Vocabulary) -> Zygote:
    """This process's zygote for ``vocabulary`` (started if none is alive). Servers in one
    process (tests) share it; it lives as long as the process: it stops by itself when
    this process's end of its socket closes (at exit at the latest)."""
    key = vocabulary.key
    with _ZYGOTES_LOCK:
        zygote = _ZYGOTES.get(key)
        if zygote is None or not zygote.is_alive():
            if not _ZYGOTES:
                atexit.register(kill_zygotes)
            zygote = _ZYGOTES[key] = Zygote(vocabulary)
        return zygote


def kill_zygotes() -> None:
    """At exit: a zygote still importing would otherwise outlive this process by seconds
    (holding its stdout and stderr); its compile processes die with it."""
    for zygote in list(_ZYGOTES.values()):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            zygote.kill()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux ≥ 5.3
        return None
