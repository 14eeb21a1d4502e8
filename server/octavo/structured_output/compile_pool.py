"""Grammar compiles in processes that can be killed, in two kinds of lane, so that a small
constraint never waits behind a large one.

Every constraint first goes to a fast lane (``num_fast`` of them, each with a compile
process). A compile that takes longer than ``FAST_SECONDS`` there is killed and the job
moves to a slow lane (``num_slow``), where it compiles again with its whole deadline: a
fast lane is never held longer than ``FAST_SECONDS``, whatever the queue holds, so a
small constraint (milliseconds) is compiled within a fraction of a second even while
large ones are being compiled or are queued. Large constraints queue behind each other
only, and at most ``num_slow`` of them use the CPU at once.

Why measure instead of estimating the cost from the constraint: xgrammar's compile time
is not a function of the text's size (5,000 enum values compile in 0.3 s, 20,000 in
50 s, a few pathological rules in seconds), whereas the time a compile has taken is
exact; and a compile process forks from the zygote in milliseconds, so killing one costs
little (``zygote.py``). The deadline counts the compile in the slow lane (or, when it is
shorter than ``FAST_SECONDS``, the fast lane's), never the time spent queued.

A job whose caller gave up (its client left) is dropped if still queued and, if being
compiled, its process is killed and a fresh one forked in its place. Nothing here blocks
the server's exit: the threads are daemons and ``shutdown`` fails the queued jobs and
kills the compile processes.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from octavo.structured_output.compile_worker import Vocabulary
from octavo.structured_output.params import StructuredOutputsParams
from octavo.structured_output.zygote import (
    STARTUP_TIMEOUT_SECONDS,
    CompileProcess,
    CompilerUnavailable,
    ProcessLost,
    shared_zygote,
)

__all__ = [
    "STARTUP_TIMEOUT_SECONDS",
    "CompileJob",
    "CompilePool",
    "CompileTimeout",
    "CompilerUnavailable",
    "shared_zygote",
]

logger = logging.getLogger(__name__)

FAST_SECONDS = 0.25  # the longest a compile holds a fast lane (real schemas: ~15 ms)


class CompileTimeout(Exception):
    """The compile ran past its deadline (its process was killed)."""


@dataclass
class CompileJob:
    params: StructuredOutputsParams
    deadline_seconds: float  # compile time allowed, queueing not included
    future: Future = field(default_factory=Future)  # Compiled, Invalid or an exception
    abandoned: threading.Event = field(default_factory=threading.Event)


@dataclass
class Lane:
    """One kind of lane (fast or slow): the queue its threads take jobs from."""

    name: str
    jobs: queue.SimpleQueue[CompileJob | None]
    fast: bool


class CompilePool:
    """``num_fast`` fast and ``num_slow`` slow lanes, a thread each; the fast lanes start
    their processes at once, the slow lanes when they get a job. ``ready`` is done when
    the first process is up (or failed when no fast lane could start one)."""

    def __init__(self, vocabulary: Vocabulary, num_fast: int, num_slow: int | None = None) -> None:
        self._vocabulary = vocabulary
        self._fast = Lane("fast", queue.SimpleQueue(), fast=True)
        self._slow = Lane("slow", queue.SimpleQueue(), fast=False)
        self._lock = threading.Lock()
        self._processes: set[CompileProcess] = set()
        self._closed, self._failed_starts = False, 0
        self.ready: Future[None] = Future()
        self._num_fast, self._num_slow = num_fast, num_fast if num_slow is None else num_slow
        for lane, count in ((self._fast, self._num_fast), (self._slow, self._num_slow)):
            for index in range(count):
                name = f"octavo-grammar-{lane.name}-{index}"
                threading.Thread(target=self._serve, args=(lane,), name=name, daemon=True).start()

    def submit(self, params: StructuredOutputsParams, deadline_seconds: float) -> CompileJob:
        job = CompileJob(params, deadline_seconds)
        with self._lock:  # not queued after ``shutdown`` failed the queued jobs
            if not self._closed:
                self._fast.jobs.put(job)
                return job
        job.future.set_exception(CompilerUnavailable("the server is shutting down"))
        return job

    def shutdown(self) -> None:
        """Fail the queued jobs and kill the processes (compiles in flight included)."""
        with self._lock:
            self._closed = True
            processes = list(self._processes)
        for lane, count in ((self._fast, self._num_fast), (self._slow, self._num_slow)):
            _fail_queued(lane.jobs)
            for _ in range(count):
                lane.jobs.put(None)
        for process in processes:
            process.kill()

    def _serve(self, lane: Lane) -> None:
        process = self._start_or_none() if lane.fast else None
        while (job := lane.jobs.get()) is not None:
            if not _still_wanted(job):
                continue
            try:
                process = process or self._start()
            except Exception as error:
                job.future.set_exception(error)
                continue
            if not self._compile(process, job, lane):
                self._retire(process)
                process = self._start_or_none() if lane.fast else None  # ready for the next

    def _compile(self, process: CompileProcess, job: CompileJob, lane: Lane) -> bool:
        """Compile ``job`` on ``process``: its answer, its deadline's error, or (past
        ``FAST_SECONDS`` in a fast lane) a place in the slow lane's queue. False when the
        process was killed (or must be: it is still compiling)."""
        limit = min(FAST_SECONDS, job.deadline_seconds) if lane.fast else job.deadline_seconds
        try:
            process.send(job.params)
            answer = process.wait(limit, job.abandoned)
        except ProcessLost:
            stopped = "the server is shutting down" if self._closed else "the compile was stopped"
            job.future.set_exception(CompilerUnavailable(stopped))
            return False
        if answer is not None:
            job.future.set_result(answer)
            return True
        if self._closed:
            job.future.set_exception(CompilerUnavailable("the server is shutting down"))
        elif lane.fast and job.deadline_seconds > FAST_SECONDS:
            self._slow.jobs.put(job)  # its future stays running: the slow lane answers it
        else:
            job.future.set_exception(CompileTimeout(f"{job.deadline_seconds:g} s"))
        return False

    def _retire(self, process: CompileProcess) -> None:
        process.kill()
        with self._lock:
            self._processes.discard(process)

    def _start_or_none(self) -> CompileProcess | None:
        try:
            return self._start()
        except Exception as error:
            if self._closed:
                return None
            logger.warning("could not start a grammar compile process: %s", error)
            with self._lock:
                self._failed_starts += 1
                if self._failed_starts >= self._num_fast and not self.ready.done():
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


def _still_wanted(job: CompileJob) -> bool:
    """Whether to compile a job taken from a queue: not if its caller gave up meanwhile.
    A job moved from a fast lane has a running future already."""
    if not job.future.running():
        return not job.abandoned.is_set() and job.future.set_running_or_notify_cancel()
    if job.abandoned.is_set():
        job.future.set_exception(CompilerUnavailable("the compile was stopped"))
        return False
    return True


def _fail_queued(jobs: queue.SimpleQueue[CompileJob | None]) -> None:
    """Answer every job still queued: the pool is shutting down."""
    while True:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            return
        if job is not None and (job.future.running() or job.future.set_running_or_notify_cancel()):
            job.future.set_exception(CompilerUnavailable("the server is shutting down"))
