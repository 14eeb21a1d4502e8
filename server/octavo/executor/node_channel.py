"""The TCP channel between the leader's engine core and a worker host (``--nnodes``).

Each connection is a ``multiprocessing.connection.Connection`` over TCP, so the
executor drives a remote rank exactly as a local one: pickled calls one way, pickled
answers the other. Before anything is unpickled both ends prove they hold the shared
secret ``OCTAVO_NODE_KEY`` (the mutual HMAC challenge of ``multiprocessing``'s own
listeners): pickle from an unauthenticated peer would run its code. Then the peer says
who it is (a ``hello``: a node link or one rank, with its layout and version) and the
leader answers ``("ok", None)`` or ``("error", why)``. There is no fallback key: a
multi-node leader or worker host without ``OCTAVO_NODE_KEY`` refuses to start.

Sockets keep TCP keepalive on (a silently vanished host errors in about 25 s instead of
hanging) and Nagle off (a step's small messages go out at once).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import struct
import time
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

import octavo
from octavo.distributed.node_layout import NodeLayout

logger = logging.getLogger(__name__)

KEY_ENV = "OCTAVO_NODE_KEY"
HANDSHAKE_SECONDS = 10.0  # a peer that connects must prove its key and say hello this fast
RETRY_SECONDS = 1.0  # a worker host tries to reach the leader this often
PROGRESS_LOG_SECONDS = 15.0  # waits on the other side are logged this often
KEEPALIVE = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}

# What a connection attempt may fail with short of a refusal: no listener yet, a reset, or
# a peer that does not speak the handshake (a malformed challenge fails an ``assert`` in
# ``multiprocessing``, a malformed answer unpickling or unpacking).
UNANSWERED = (OSError, EOFError, AssertionError, ValueError, pickle.UnpicklingError)

NODE_LINK = "node"  # a host's liveness link (one per worker host)
RANK_LINK = "worker"  # one rank's calls and answers
STOP_NODE = "stop"  # the leader's clean stop, on a node link
ABORT_NODE = "abort"  # the leader's stop on a failure: (ABORT_NODE, why), on a node link
WORKER_EXITED = "worker-exited"  # a worker host's report: (WORKER_EXITED, rank, exit code)


class NodeChannelError(RuntimeError):
    """The channel cannot be set up: no answer, a wrong key, or a refusal."""


class NodeRefused(NodeChannelError):
    """The leader refused this host (or the leader refuses a host): layouts differ."""


class NodeKeyMissing(NodeChannelError, ValueError):
    """A multi-node leader or worker host was started without ``OCTAVO_NODE_KEY``."""


def node_key() -> bytes:
    """The shared secret ``OCTAVO_NODE_KEY``; ``NodeKeyMissing`` when it is not set."""
    key = os.environ.get(KEY_ENV, "")
    if not key:
        raise NodeKeyMissing(
            f"{KEY_ENV} is not set: a multi-node engine (--nnodes > 1) needs the same secret "
            f"in {KEY_ENV} on the leader and on every --headless worker host (the node "
            "channel carries pickled calls: without a key anyone who reaches --master-port "
            "could run code in the engine); the operator writes one per group in the Secret "
            "<name>-node-key"
        )
    return key.encode()


def require_node_key(nnodes: int) -> None:
    """Refuse to start a multi-node leader or worker host without the key."""
    if nnodes > 1:
        node_key()


def hello(layout: NodeLayout, kind: str, rank: int | None = None) -> dict[str, Any]:
    """What a worker host's connection says about itself."""
    return {
        "kind": kind,
        "node_rank": layout.node_rank,
        "rank": rank,
        "nnodes": layout.nnodes,
        "tensor_parallel_size": layout.tensor_parallel_size,
        "pipeline_parallel_size": layout.pipeline_parallel_size,
        "version": octavo.__version__,
        "host": socket.gethostname(),
    }


def tune(sock: socket.socket) -> None:
    """Keepalive on, Nagle off."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for name, value in KEEPALIVE.items():
        if hasattr(socket, name):  # Linux names; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


@contextlib.contextmanager
def io_timeout(sock: socket.socket, seconds: float) -> Iterator[None]:
    """Kernel timeouts on a blocking socket (``Connection`` reads its descriptor
    directly): a silent peer fails the read with an ``OSError`` instead of hanging."""
    whole = int(seconds)
    limit = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, limit)
    try:
        yield
    finally:
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", 0, 0))


def accept_peer(sock: socket.socket, key: bytes) -> tuple[Connection, dict[str, Any]]:
    """The leader's side of a new connection: the mutual challenge, then the peer's hello.
    The caller owns ``sock`` and bounds the whole handshake (``node_admission``); any
    exception means a peer to drop (``AuthenticationError``: it lacks the key)."""
    sock.setblocking(True)
    tune(sock)
    conn = Connection(os.dup(sock.fileno()))
    try:
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
        greeting = conn.recv()
        if not isinstance(greeting, dict) or greeting.get("kind") not in (NODE_LINK, RANK_LINK):
            raise EOFError(f"not a worker host's hello: {greeting!r:.200}")
    except BaseException:
        conn.close()
        raise
    return conn, greeting


def connect_to_leader(layout: NodeLayout, greeting: dict[str, Any], deadline: float) -> Connection:
    """A worker host's connection to the leader, accepted; retried until ``deadline``
    (the leader's name may not resolve yet, or it may not listen yet)."""
    host, port = layout.control_address
    key = node_key()
    started, last_error, next_log = time.monotonic(), "none", time.monotonic()
    while True:
        try:
            return _open(layout, greeting, key, deadline)
        except AuthenticationError:
            raise NodeChannelError(
                f"the leader {host}:{port} and this host hold different keys: set the same "
                f"{KEY_ENV} on every node"
            ) from None
        except UNANSWERED as error:  # not (yet) a leader that answers: try again
            last_error = f"{type(error).__name__}: {error!s:.200}"
        now = time.monotonic()
        if now >= deadline:
            raise NodeChannelError(
                f"the leader {host}:{port} did not answer within {now - started:.0f} s "
                f"(last error: {last_error})"
            )
        if now >= next_log:
            next_log = now + PROGRESS_LOG_SECONDS
            logger.info(
                "trying to reach the leader %s:%d (%s); %.0f s left",
                host,
                port,
                last_error,
                deadline - now,
            )
        time.sleep(min(RETRY_SECONDS, max(0.0, deadline - now)))


def _open(layout: NodeLayout, greeting: dict[str, Any], key: bytes, deadline: float) -> Connection:
    timeout = max(0.1, min(HANDSHAKE_SECONDS, deadline - time.monotonic()))
    with socket.create_connection(layout.control_address, timeout=timeout) as sock:
        sock.setblocking(True)
        tune(sock)
        with io_timeout(sock, HANDSHAKE_SECONDS):
            conn = Connection(os.dup(sock.fileno()))
            try:
                answer_challenge(conn, key)
                deliver_challenge(conn, key)
                conn.send(greeting)
                status, detail = conn.recv()
            except BaseException:
                conn.close()
                raise
    if status != "ok":
        conn.close()
        raise NodeRefused(f"the leader refused this host: {detail}")
    return conn
