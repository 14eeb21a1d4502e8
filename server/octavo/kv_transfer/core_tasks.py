"""Work other threads hand to the engine's core thread, which runs it between steps.

The KV cache's tensors and block tables belong to the core thread: a side channel thread
that must read blocks (or free them) posts a function here and waits for its result; the
core loop runs every posted function at the start of its next step, or within a few
milliseconds when it is idle (``EngineCore`` polls while ``pending`` is true).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

DEFAULT_WAIT_SECONDS = 60.0  # a read waits at most this long for the core thread


class CoreThreadTimeout(Exception):
    """The core thread did not run the posted work in time (busy or stopped)."""


class CoreTasks:
    def __init__(self) -> None:
        self._queue: deque[tuple[Callable[[], object], Future]] = deque()
        self._lock = threading.Lock()
        self.posted = threading.Event()  # set while work waits (an idle loop can wake on it)

    def call(self, work: Callable[[], T], timeout: float = DEFAULT_WAIT_SECONDS) -> T:
        """Run ``work`` on the core thread and return its result (or raise its exception)."""
        future: Future = Future()
        with self._lock:
            self._queue.append((work, future))
            self.posted.set()
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            message = f"the engine's core thread did not answer in {timeout} s"
            raise CoreThreadTimeout(message) from None

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def run_pending(self) -> None:
        """On the core thread: run every posted function, handing back results or errors."""
        while True:
            with self._lock:
                if not self._queue:
                    self.posted.clear()
                    return
                work, future = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # its caller stopped waiting
            try:
                future.set_result(work())
            except Exception as error:  # handed to the waiting thread
                future.set_exception(error)
