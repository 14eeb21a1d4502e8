"""The leader's wait for its worker hosts: a bounded, logged join on ``master_port``.

Every worker host (``octavo serve --headless``) first opens its node link, then one
connection per rank it runs. The leader accepts them until every host and rank is
there, checks each hello against its own layout (a host started with other parallel
sizes, another ``--nnodes``, another octavo version or a rank already taken is refused
and fails the load: the group must be recreated with matching flags), logs what it still
waits for every ``PROGRESS_LOG_SECONDS``, and after ``timeout`` seconds gives up with
``WorkersDidNotJoin`` naming the missing hosts and ranks. Connections are handshaken side
by side (``node_admission``): a peer without the key, a silent or garbled one, is dropped
on its own and the wait goes on.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import octavo
from octavo.distributed.node_layout import NodeLayout, rank_span
from octavo.executor.node_admission import Admitted, NodeDoor
from octavo.executor.node_channel import (
    KEY_ENV,
    NODE_LINK,
    PROGRESS_LOG_SECONDS,
    NodeChannelError,
    NodeRefused,
    node_key,
)
from octavo.executor.remote_worker import NodeLink, RemoteWorkerHandle

logger = logging.getLogger(__name__)

FLAGS = {
    "nnodes": "--nnodes",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
}


class WorkersDidNotJoin(RuntimeError):
    """A worker host did not join within ``--node-join-timeout``: the engine cannot load."""


@dataclass
class JoinedHosts:
    links: list[NodeLink]  # by node
    workers: list[RemoteWorkerHandle]  # by rank


class NodeRendezvous:
    def __init__(self, layout: NodeLayout, timeout: float) -> None:
        self.layout, self.timeout = layout, timeout
        self.links: dict[int, NodeLink] = {}
        self.workers: dict[int, RemoteWorkerHandle] = {}
        self._key = node_key()
        host = layout.listen_host() or "0.0.0.0"
        self._where = f"{host}:{layout.master_port}"

    def gather(self) -> JoinedHosts:
        """Every worker host's link and ranks, or ``WorkersDidNotJoin``/``NodeRefused``."""
        try:
            server = socket.create_server((self.layout.listen_host(), self.layout.master_port))
        except OSError as error:
            message = f"cannot listen for worker hosts on {self._where}: {error}"
            raise NodeChannelError(message) from None
        try:
            with server, NodeDoor(server, self._key) as door:
                self._accept_all(door)
        except BaseException as error:
            self.abandon(f"the leader gave up waiting for its worker hosts: {error}")
            raise
        return JoinedHosts(
            [self.links[n] for n in sorted(self.links)],
            [self.workers[r] for r in sorted(self.workers)],
        )

    def abandon(self, reason: str) -> None:
        """Stop the hosts that joined (the leader gives up loading)."""
        for link in self.links.values():
            link.abort(reason)
        for worker in self.workers.values():
            worker.conn.close()

    def _accept_all(self, door: NodeDoor) -> None:
        started = time.monotonic()
        deadline, next_log = started + self.timeout, started + PROGRESS_LOG_SECONDS
        logger.info(
            "multi-node: node 0 of %d, local %s; waiting for %s on %s (up to %.0f s)",
            self.layout.nnodes,
            rank_span(self.layout.ranks_on(0)),
            ", ".join(self._missing()),
            self._where,
            self.timeout,
        )
        while self._missing():
            now = time.monotonic()
            if now >= deadline:
                raise WorkersDidNotJoin(self._timeout_message())
            if now >= next_log:
                next_log = now + PROGRESS_LOG_SECONDS
                logger.info("still waiting for %s; %.0f s left", self._progress(), deadline - now)
            admitted = door.next(min(deadline, next_log) - now)
            if admitted is not None:
                self._admit(admitted, started)

    def _admit(self, admitted: Admitted, started: float) -> None:
        """Answer a peer that holds the key: welcome, or refuse it and fail the load."""
        problem = self._problem(admitted.greeting, admitted.peer)
        if problem is not None:
            _answer(admitted.conn, ("error", problem))
            admitted.conn.close()
            logger.error("refused %s: %s", admitted.peer, problem)
            raise NodeRefused(problem)
        _answer(admitted.conn, ("ok", None))
        self._record(admitted.conn, admitted.greeting, admitted.peer, started)

    def _problem(self, greeting: dict[str, Any], peer: str) -> str | None:
        node, layout = greeting.get("node_rank"), self.layout
        for name, flag in FLAGS.items():
            if greeting.get(name) != getattr(layout, name):
                return (
                    f"node {node} ({peer}) was started with {flag} {greeting.get(name)}, "
                    f"the leader with {flag} {getattr(layout, name)}"
                )
        if greeting.get("version") != octavo.__version__:
            return (
                f"node {node} ({peer}) runs octavo {greeting.get('version')}, the leader "
                f"{octavo.__version__}: every node must run the same version"
            )
        if not isinstance(node, int) or not 1 <= node < layout.nnodes:
            return f"{peer} joined as node {node}; the worker hosts are nodes 1-{layout.nnodes - 1}"
        if greeting["kind"] == NODE_LINK:
            if node in self.links:
                return (
                    f"node {node} joined twice (from {self.links[node].peer} and {peer}): "
                    "each worker host needs its own --node-rank"
                )
            return None
        rank = greeting.get("rank")
        if node not in self.links or rank not in layout.ranks_on(node) or rank in self.workers:
            return f"node {node} ({peer}) offered rank {rank}, which is not one it should run"
        return None

    def _record(
        self, conn: Connection, greeting: dict[str, Any], peer: str, started: float
    ) -> None:
        node = greeting["node_rank"]
        if greeting["kind"] == NODE_LINK:
            self.links[node] = NodeLink(node, conn, peer, self.layout.ranks_on(node))
            return
        self.workers[greeting["rank"]] = RemoteWorkerHandle(greeting["rank"], conn, node, peer)
        if all(rank in self.workers for rank in self.layout.ranks_on(node)):
            logger.info(
                "node %d joined from %s (%s) after %.1f s (%s)",
                node,
                peer,
                greeting.get("host"),
                time.monotonic() - started,
                rank_span(self.layout.ranks_on(node)),
            )

    def _missing(self) -> list[str]:
        """The worker hosts not joined yet, as ``node 1 (ranks 2-3)``."""
        return [
            self.layout.describe(node)
            for node in range(1, self.layout.nnodes)
            if not all(rank in self.workers for rank in self.layout.ranks_on(node))
        ]

    def _progress(self) -> str:
        parts = []
        for node in range(1, self.layout.nnodes):
            ranks = self.layout.ranks_on(node)
            joined = sum(rank in self.workers for rank in ranks)
            if joined < len(ranks):
                link = "linked" if node in self.links else "not connected"
                parts.append(
                    f"{self.layout.describe(node)}: {link}, {joined} of "
                    f"{len(ranks)} workers connected"
                )
        return "; ".join(parts)

    def _timeout_message(self) -> str:
        layout = self.layout
        return (
            f"worker host(s) {', '.join(self._missing())} did not join {self._where} within "
            f"{self.timeout:.0f} s (--node-join-timeout); check that they run `octavo serve "
            f"--headless --node-rank R --nnodes {layout.nnodes} --master-addr "
            f"{layout.master_addr} --master-port {layout.master_port}` with the same "
            f"{KEY_ENV}, and that this port is reachable from them"
        )


def _answer(conn: Connection, reply: tuple[str, Any]) -> None:
    try:
        conn.send(reply)
    except OSError as error:
        logger.warning("could not answer a worker host: %s", error)
