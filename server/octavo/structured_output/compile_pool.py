"""Grammar compiles in processes that can be killed: a deadline really stops a compile.

A few compile processes stay up and take constraints one at a time (a trivial one costs
a pipe round trip, about a millisecond). A daemon thread per process hands it the queued
jobs. A job whose caller gave up (its deadline passed, or its client left) is dropped if
still queued and, if it is being compiled, its process is killed (SIGKILL: the C++
compile cannot be interrupted otherwise) and a fresh one forked in its place.

The processes fork from a zygote process that imported xgrammar and loaded the
vocabulary once (seconds: the server starts it when the engine is ready, see
``GrammarChecker.warm``): a replacement is ready in milliseconds and shares the zygote's
memory. The zygote is a plain subprocess that imports what compiling needs, not the
server (``compile_worker.start_zygote``). Nothing here blocks the server's exit: the
threads are daemons, ``shutdown`` kills the compile processes, and the zygote (one per
vocabulary and process) is killed at exit (and stops by itself when this process's end
of its socket closes); its compile processes die with it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import subprocess
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
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

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECONDS = 120.0  # the first start imports xgrammar in the fork server
POLL_SECONDS = 0.05  # how soon a running job notices that its caller gave up


class CompilerUnavailable(RuntimeError):
    """No compile process could be started, or the pool is shut down."""


@dataclass
class CompileJob:
    params: StructuredOutputsParams
    future: Future = field(default_factory=Future)  # Compiled, Invalid or an exception
    abandoned: threading.Event = field(default_factory=threading.Event)


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

    def run(self, job: CompileJob) -> Compiled | Invalid | None:
        """The job's answer; ``None`` if the caller gave up first or the process died
        (then this process is killed and must be replaced)."""
        try:
            self._conn.send(job.params)
            while not self._conn.poll(POLL_SECONDS):
                if job.abandoned.is_set():
                    raise TimeoutError
            answer = self._conn.recv()
            if isinstance(answer, Compiled | Invalid):
                return answer
        except (EOFError, OSError):  # TimeoutError included: the caller gave up
            pass
        self.kill()
        return None

    def kill(self) -> None:
        """SIGKILL (through a pidfd where Linux has them: never another process)."""
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
                atexit.register(_kill_zygotes)
            zygote = _ZYGOTES[key] = Zygote(vocabulary)
        return zygote


def _kill_zygotes() -> None:
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


class CompilePool:
    """``num_processes`` compile processes, each started at once by its thread; ``ready``
    is done when the first is up (or failed when none could start)."""

    def __init__(self, vocabulary: Vocabulary, num_processes: int) -> None:
        self._vocabulary = vocabulary
        self._jobs: queue.SimpleQueue[CompileJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._processes: set[CompileProcess] = set()
        self._closed, self._failed_starts = False, 0
        self.ready: Future[None] = Future()
        self._num_threads = num_processes
        for index in range(num_processes):
            name = f"octavo-grammar-{index}"
            threading.Thread(target=self._serve, name=name, daemon=True).start()

    def submit(self, params: StructuredOutputsParams) -> CompileJob:
        job = CompileJob(params)
        if self._closed:
            job.future.set_exception(CompilerUnavailable("the server is shutting down"))
        else:
            self._jobs.put(job)
        return job

    def shutdown(self) -> None:
        """Drop queued jobs and kill the processes (compiles in flight included)."""
        with self._lock:
            self._closed = True
            processes = list(self._processes)
        for _ in range(self._num_threads):
            self._jobs.put(None)
        for process in processes:
            process.kill()

    def _serve(self) -> None:
        process = self._start_or_none()
        while (job := self._jobs.get()) is not None:
            if job.abandoned.is_set() or not job.future.set_running_or_notify_cancel():
                continue  # its caller gave up while it was queued
            try:
                process = process or self._start()
            except Exception as error:
                job.future.set_exception(error)
                continue
            answer = process.run(job)
            if answer is not None:
                job.future.set_result(answer)
                continue
            job.future.set_exception(CompilerUnavailable("the compile was stopped"))
            with self._lock:
                self._processes.discard(process)
            process = self._start_or_none()  # forked now: ready when the next job comes

    def _start_or_none(self) -> CompileProcess | None:
        try:
            return self._start()
        except Exception as error:
            if self._closed:
                return None
            logger.warning("could not start a grammar compile process: %s", error)
            with self._lock:
                self._failed_starts += 1
                if self._failed_starts >= self._num_threads and not self.ready.done():
                    self.ready.set_exception(error)
            return None

    def _start(self) -> CompileProcess:
        if self._closed:
            raise CompilerUnavailable("the server is shutting down")
        process = shared_zygote(self._vocabulary).fork()  # the first fork waits for it
        with self._lock:
            self._processes.add(process)
            if not self.ready.done():
                self.ready.set_result(None)
        if self._closed:
            process.kill()
            raise CompilerUnavailable("the server is shutting down")
        return process
