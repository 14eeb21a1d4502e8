"""The leader's handles on a worker host: one per remote rank, one for the host itself.

A ``RemoteWorkerHandle`` is what ``WorkerHandle`` is for a local rank, minus the
process: the executor sends it calls and reads its answers over its TCP connection.
A ``NodeLink`` is the host's liveness link (``node_watch``) and carries the leader's
stop: a clean one, or an abort (the engine failed) that the host reports as a failure.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from multiprocessing.connection import Connection

from octavo.distributed.node_layout import rank_span
from octavo.executor.node_channel import ABORT_NODE, STOP_NODE


@dataclass
class RemoteWorkerHandle:
    rank: int
    conn: Connection
    node: int
    peer: str  # the host's address as the leader saw it

    def exit_description(self) -> str:
        return f"worker {self.rank} on node {self.node} ({self.peer}) disconnected"

    def wait_stopped(self, deadline: float) -> None:
        """Nothing to wait for here: its host stops it (and exits) after the stop."""


@dataclass
class NodeLink:
    node: int
    conn: Connection
    peer: str
    ranks: range

    def describe(self) -> str:
        return f"worker host {self.node} ({self.peer}, {rank_span(self.ranks)})"

    def stop(self) -> None:
        """Tell the host this is a clean stop (it exits 0), and close the link."""
        self._close_with(STOP_NODE)

    def abort(self, reason: str) -> None:
        """Tell the host the engine stops on a failure (it exits 2), and close the link."""
        self._close_with((ABORT_NODE, reason))

    def _close_with(self, message: object) -> None:
        with contextlib.suppress(OSError):  # closed already (aborted), or the host is gone
            self.conn.send(message)
        self.conn.close()
