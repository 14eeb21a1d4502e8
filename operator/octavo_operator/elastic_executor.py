"""A thread pool that grows for a burst and shrinks after it.

kopf runs sync handlers on ``settings.execution.executor``. A burst of creates wants many
threads (handlers mostly wait on the apiserver), but the standard ThreadPoolExecutor keeps
every thread it ever started, with its stack and its allocator caches, for good. Here a
worker that has had nothing to do for ``idle_seconds`` exits; the next burst starts new
ones (tens of microseconds each).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

WorkItem = tuple[Future, Callable[..., Any], tuple, dict]


class ElasticExecutor(Executor):
    def __init__(self, max_workers: int, idle_seconds: float = 5.0, name: str = "worker"):
        self.max_workers = max_workers
        self.idle_seconds = idle_seconds
        self.name = name
        self._queue: queue.SimpleQueue[WorkItem | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0  # submitted, not yet taken by a worker
        self._shutdown = False

    @property
    def threads(self) -> int:
        return self._threads

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._queue.put((future, fn, args, kwargs))
            self._pending += 1
            if self._pending > self._idle and self._threads < self.max_workers:
                self._threads += 1
                threading.Thread(
                    target=self._work, name=f"{self.name}-{self._threads}", daemon=True
                ).start()
        return future

    def _work(self) -> None:
        while True:
            item = self._next_item()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:  # handed to whoever waits on the future
                future.set_exception(error)

    def _next_item(self) -> WorkItem | None:
        """The next work item, or None when this worker should exit (idle, or shut down)."""
        while True:
            with self._lock:
                self._idle += 1
            try:
                item = self._queue.get(timeout=self.idle_seconds)
            except queue.Empty:
                item = None
            with self._lock:
                self._idle -= 1
                if item is not None:
                    self._pending -= 1
                    return item
                if self._pending > 0 and not self._shutdown:
                    continue  # work arrived as the wait ended: take it
                self._threads -= 1
                return None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            workers = self._threads
        for _ in range(workers):
            self._queue.put(None)
