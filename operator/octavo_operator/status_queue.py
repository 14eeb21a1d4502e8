"""Status writes, coalesced and off the handlers' threads.

A burst of watch events (a Deployment created and its status filled in, its pods
scheduled, started, ready) asks for a service's status many times within a second. The
handlers only ask (``request``); a few writer threads compute each status once, from the
newest copies in kopf's in-memory indexes, however many times it was asked for meanwhile.
The handlers' threads are then free for what users wait for: applying children.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from octavo_operator.kube import NotLeading

logger = logging.getLogger(__name__)
Key = tuple[str, str]
Write = Callable[[Key, Mapping[str, Any]], None]  # key, kopf's indexes by name


class StatusQueue:
    def __init__(self, write: Write, workers: int = 4) -> None:
        self._write = write
        self._pending: dict[Key, tuple[Mapping[str, Any], contextvars.Context]] = {}
        self._order: deque[Key] = deque()
        self._ready = threading.Condition()
        for index in range(workers):
            threading.Thread(target=self._run, name=f"status-{index}", daemon=True).start()

    def request(self, key: Key, indexes: Mapping[str, Any]) -> None:
        """Write ``key``'s status soon; asking again before it is written adds nothing.
        The write runs in the caller's context (kopf's, for the Events it posts)."""
        with self._ready:
            if key not in self._pending:
                self._order.append(key)
            self._pending[key] = (indexes, contextvars.copy_context())
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._order:
                    self._ready.wait()
                key = self._order.popleft()
                indexes, context = self._pending.pop(key)
            try:
                context.run(self._write, key, indexes)
            except NotLeading:  # the Lease is lost: this process is stopping
                logger.warning("status of %s/%s not written: no longer the leader", *key)
            except Exception:  # one service's write must not stop the writers
                logger.exception("writing the status of %s/%s failed", *key)
