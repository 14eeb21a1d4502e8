"""The leader's door on ``master_port``: every incoming connection's handshake in its own
thread, under one deadline for the whole handshake.

A peer gets ``HANDSHAKE_SECONDS`` in all to prove it holds ``OCTAVO_NODE_KEY`` and say
hello: the deadline covers the whole handshake, not each read, so a peer trickling a byte
at a time is cut off as surely as a silent one. Handshakes run side by side, so a
stranger that connects and stalls never holds up a real worker host. Whatever goes wrong
in one handshake (a wrong key, garbage, silence, a malformed message) drops that
connection only, with one log line; the join goes on. At most ``MAX_PENDING`` handshakes
run at once; a connection beyond that is closed at once.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from octavo.executor.node_channel import HANDSHAKE_SECONDS, KEY_ENV, accept_peer

logger = logging.getLogger(__name__)

MAX_PENDING = 128  # handshakes in flight at once
TICK_SECONDS = 0.05  # how often the door checks for overdue handshakes and its close


@dataclass
class Admitted:
    """A peer that proved the key and said hello (its layout is not checked yet)."""

    conn: Connection
    greeting: dict[str, Any]
    peer: str


@dataclass
class _Pending:
    sock: socket.socket
    deadline: float


class NodeDoor:
    """Accepts connections on ``server`` in the background; ``next`` hands out the
    peers that passed the handshake. Use as a context manager (closing it drops every
    handshake in flight and every peer not handed out)."""

    def __init__(self, server: socket.socket, key: bytes) -> None:
        self._server, self._key, self._seconds = server, key, HANDSHAKE_SECONDS
        self._admitted: queue.Queue[Admitted] = queue.Queue()
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="octavo-node-door", daemon=True
        )

    def __enter__(self) -> NodeDoor:
        self._server.settimeout(TICK_SECONDS)
        self._acceptor.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def next(self, timeout: float) -> Admitted | None:
        """The next peer that passed its handshake, or None after ``timeout`` seconds."""
        try:
            return self._admitted.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def close(self) -> None:
        """Stop accepting, cut the handshakes in flight, close the peers not handed out."""
        with self._lock:
            self._closed.set()
            for pending in self._pending.values():
                _cut(pending.sock)
            self._pending.clear()
        if self._acceptor.is_alive():
            self._acceptor.join()
        while not self._admitted.empty():
            self._admitted.get_nowait().conn.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            self._cut_overdue()
            try:
                sock, address = self._server.accept()
            except TimeoutError:
                continue
            except OSError as error:  # out of descriptors, say: try again shortly
                logger.warning("accepting a worker host's connection failed: %s", error)
                time.sleep(TICK_SECONDS)
                continue
            self._start_handshake(sock, str(address[0]))

    def _start_handshake(self, sock: socket.socket, peer: str) -> None:
        with self._lock:
            if self._closed.is_set() or len(self._pending) >= MAX_PENDING:
                sock.close()
                if not self._closed.is_set():
                    logger.warning("dropped a connection from %s: too many handshakes", peer)
                return
            self._pending[id(sock)] = _Pending(sock, time.monotonic() + self._seconds)
        name = f"octavo-node-handshake-{peer}"
        threading.Thread(target=self._handshake, args=(sock, peer), name=name, daemon=True).start()

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        """On its own thread: one peer's handshake; the peer is queued if it passed."""
        admitted = None
        try:
            conn, greeting = accept_peer(sock, self._key)
            admitted = Admitted(conn, greeting, peer)
        except AuthenticationError:
            logger.warning(
                "refused a connection from %s: it does not hold this engine's %s", peer, KEY_ENV
            )
        except Exception as error:  # garbage, silence, a malformed message: this peer only
            logger.warning("ignored a connection from %s: %s", peer, _brief(error))
        with self._lock:
            in_time = self._pending.pop(id(sock), None) is not None
            if admitted is not None and in_time:
                self._admitted.put(admitted)
                admitted = None
            late = admitted is not None and not self._closed.is_set()
        if admitted is not None:
            admitted.conn.close()
        if late:
            logger.warning("ignored a connection from %s: its handshake ran late", peer)
        sock.close()

    def _cut_overdue(self) -> None:
        """Cut the handshakes past their deadline (their reads end at once)."""
        now = time.monotonic()
        with self._lock:
            for key, pending in list(self._pending.items()):
                if pending.deadline <= now:
                    _cut(pending.sock)
                    del self._pending[key]


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _brief(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 200 else text[:200] + "…"
