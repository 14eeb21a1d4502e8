"""Noticing a worker host's loss the moment it happens (the twin of ``worker_watch``).

A ``NodeWatch`` thread waits on every worker host's node link. The host sends nothing
on it while all is well; a readable link means either the host's report that one of its
workers exited (``(WORKER_EXITED, rank, code)``) or the link's end: the host (or its
agent) died, or its network went away (TCP keepalive turns silence into an error). The
first loss that is not part of a shutdown is reported once to the listener, on the
watch thread, so ``/health`` turns 503 while the engine stops the other ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import wait

from octavo.executor.first_event_watch import FirstEventWatch
from octavo.executor.node_channel import WORKER_EXITED
from octavo.executor.remote_worker import NodeLink

LossListener = Callable[[str], None]  # called with a description of what was lost


class NodeWatch(FirstEventWatch[str]):
    thread_name = "octavo-node-watch"

    def __init__(self, links: list[NodeLink]) -> None:
        super().__init__()
        self._links = links
        self.start()

    @property
    def lost(self) -> str | None:
        """The first loss seen."""
        return self.seen

    def on_loss(self, listener: LossListener) -> None:
        """Call ``listener`` when a worker host is lost (at once if one already is)."""
        self.on_event(listener)

    def _wait_for(self, wake_fd: int) -> str | None:
        conns = {link.conn: link for link in self._links}
        ready = wait([wake_fd, *conns])
        if wake_fd in ready or self._stopping.is_set():
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
