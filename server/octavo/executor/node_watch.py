"""Noticing a worker host's loss the moment it happens (the twin of ``worker_watch``).

A ``NodeWatch`` thread waits on every worker host's node link. The host sends nothing
on it while all is well; a readable link means either the host's report that one of its
workers exited (``(WORKER_EXITED, rank, code)``) or the link's end: the host (or its
agent) died, or its network went away (TCP keepalive turns silence into an error). The
first loss that is not part of a shutdown is reported once to the listener, on the
watch thread, so ``/health`` turns 503 while the engine stops the other ranks.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import wait

from octavo.executor.node_channel import WORKER_EXITED
from octavo.executor.remote_worker import NodeLink

LossListener = Callable[[str], None]  # called with a description of what was lost


class NodeWatch:
    def __init__(self, links: list[NodeLink]) -> None:
        self._links = links
        self._listener: LossListener | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.lost: str | None = None  # the first loss seen
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="octavo-node-watch", daemon=True)
        self._thread.start()

    def on_loss(self, listener: LossListener) -> None:
        """Call ``listener`` when a worker host is lost (at once if one already is)."""
        with self._lock:
            self._listener, lost = listener, self.lost
        if lost is not None and not self._stopping.is_set():
            listener(lost)

    def stop(self) -> None:
        """Stop watching: the links closing from now on is expected."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")

    def _run(self) -> None:
        try:
            reason = self._wait_for_a_loss()
        finally:
            for fd in (self._wake_read, self._wake_write):
                with contextlib.suppress(OSError):
                    os.close(fd)
        if reason is None or self._stopping.is_set():
            return
        with self._lock:
            self.lost, listener = reason, self._listener
        if listener is not None:
            listener(reason)

    def _wait_for_a_loss(self) -> str | None:
        conns = {link.conn: link for link in self._links}
        ready = wait([self._wake_read, *conns])
        if self._wake_read in ready or self._stopping.is_set():
            return None
        return _loss(conns[ready[0]])


def _loss(link: NodeLink) -> str:
    """What a readable link says: a worker's exit on that host, or the host's loss."""
    try:
        message = link.conn.recv()
    except (EOFError, OSError):
        return f"{link.describe()} disconnected"
    if isinstance(message, tuple) and message[:1] == (WORKER_EXITED,):
        _, rank, code = message
        return f"worker {rank} on {link.describe()} exited with code {code}"
    return f"{link.describe()} sent {message!r} instead of staying quiet"
