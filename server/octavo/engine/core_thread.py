"""The engine core on a thread of this process (tests use it to reach into the engine)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from octavo.engine.core_loop import Emit, run_engine_core


class QueueInbox:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, command: Any) -> None:
        self._queue.put(command)

    def get(self, block: bool, timeout: float | None = None) -> list[Any]:
        try:
            commands = [self._queue.get(timeout=timeout)] if block else []
        except queue.Empty:
            return []
        while True:
            try:
                commands.append(self._queue.get_nowait())
            except queue.Empty:
                return commands


class ThreadCore:
    """Runs ``run_engine_core`` on a daemon thread; events are emitted on that thread."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._inbox = QueueInbox()
        self._thread: threading.Thread | None = None

    def start(self, emit: Emit) -> None:
        args = (self._factory, self._inbox, emit)
        self._thread = threading.Thread(
            target=run_engine_core, args=args, name="octavo-engine", daemon=True
        )
        self._thread.start()

    def send(self, command: Any) -> None:
        self._inbox.put(command)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
