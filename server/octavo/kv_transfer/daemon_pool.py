"""A small pool of daemon threads for the decode side's blocking side channel calls.

``ThreadPoolExecutor``'s workers are joined when the interpreter exits, even after
``shutdown(wait=False)``: a fetch blocked on a prefill engine that vanished would hold
the process's exit for a socket timeout, longer than a pod's grace period. These
threads are daemons, so exit never waits for them; ``close`` stops them once their
current call returns.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class DaemonPool:
    def __init__(self, size: int, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True)
            for index in range(size)
        ]
        self._closed = threading.Event()
        for thread in self._threads:
            thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        """Run ``call(*args)`` on the next free thread (its exceptions are logged)."""
        self._calls.put((call, args))

    def close(self) -> None:
        """Let every thread end after its current call (calls still queued are dropped)."""
        self._closed.set()
        for _ in self._threads:
            self._calls.put(None)

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            call, args = item
            if self._closed.is_set():
                continue
            try:
                call(*args)
            except Exception:  # one call's failure must not end the thread
                logger.exception("a KV transfer call failed")
