"""A thread that waits for the first of some events and reports it once.

The executor watches its workers (``worker_watch``) and its worker hosts
(``node_watch``) the same way: a daemon thread blocks until something goes wrong, then
tells one listener, once, on that thread, unless the watch was stopped first (a
shutdown makes every exit expected). A subclass only says how to wait: ``_wait_for``
blocks until its event or until ``wake_fd`` (written by ``stop``) is readable, and
returns what happened, or None once stopped.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

Event = TypeVar("Event")


class FirstEventWatch(Generic[Event]):
    thread_name = "octavo-watch"

    def __init__(self) -> None:
        self._listener: Callable[[Event], None] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.seen: Event | None = None  # the first event, once it happened
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def on_event(self, listener: Callable[[Event], None]) -> None:
        """Call ``listener`` with the first event (at once if it already happened)."""
        with self._lock:
            self._listener, seen = listener, self.seen
        if seen is not None and not self._stopping.is_set():
            listener(seen)

    def stop(self) -> None:
        """Stop watching: what happens from now on is expected."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")

    def _run(self) -> None:
        try:
            event = self._wait_for(self._wake_read)
        finally:
            for fd in (self._wake_read, self._wake_write):
                with contextlib.suppress(OSError):
                    os.close(fd)
        if event is None or self._stopping.is_set():
            return
        with self._lock:
            self.seen, listener = event, self._listener
        if listener is not None:
            listener(event)

    def _wait_for(self, wake_fd: int) -> Event | None:
        raise NotImplementedError
