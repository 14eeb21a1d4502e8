"""The TCP side channel a prefill engine serves its leased KV blocks on.

A decode engine asks for the prefill engine's metadata (its engine id and ``KVLayout``),
reads a request's blocks naming the lease generation it was given and the digest of its
own prompt, heartbeats the lease while it waits, and frees the blocks once it has them.
Messages are ``wire`` frames.

The server never touches the cache itself: each request is handed to a ``BlockSource``
(the control plane runs reads on the engine's core thread). It listens on IPv4 or IPv6,
as its host resolves (a pod's IPv6 literal too). One thread per connection; a request
frame carries no tensors and at most ``MAX_REQUEST_HEADER_BYTES`` of header; a bad one is
answered with an error and that connection closed, and the server keeps serving the
others. Errors go back as ``{"op": "error", "error": kind, "message": ...}`` with kind
``gone`` (the lease expired, was freed, never existed, or holds another prompt),
``bad_request`` or ``internal``.

The client keeps idle connections for reuse (a pool, so concurrent reads do not wait
for each other) and turns every failure into ``TransferFailed`` (``BlocksGone`` when
the lease is gone): the decode engine then recomputes the prompt or fails the request.
The peer is not trusted: given the layout, a read refuses a reply declaring more than
the blocks asked for before allocating anything; a call may bound its own time
(heartbeats); ``close`` also ends the calls in flight, so none outlives the engine.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from octavo.kv_transfer.block_io import BlockPayload, KVLayout
from octavo.kv_transfer.leases import LeaseExpired
from octavo.kv_transfer.wire import (
    MAX_FRAME_BYTES,
    ConnectionClosed,
    Frame,
    ProtocolError,
    recv_frame,
    send_frame,
)

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
IDLE_TIMEOUT = 300.0  # the server drops a connection silent this long
MAX_IDLE_CONNECTIONS = 4  # per client
SHUTDOWN_POLL_SECONDS = 0.05  # how soon ``close`` stops the serving thread
MAX_REQUEST_HEADER_BYTES = 2**20  # a read's block ids fit many times over


class TransferFailed(Exception):
    """The blocks could not be read: the connection, the protocol or the peer failed."""


class BlocksGone(TransferFailed):
    """The prefill engine no longer holds the blocks (the lease expired or is unknown)."""


class BlockSource(Protocol):
    """What the server serves (the control plane's; reads run on the core loop thread)."""

    def metadata(self) -> dict: ...

    def read(
        self, request_id: str, generation: int, block_ids: list[int], digest: str
    ) -> BlockPayload: ...

    def free(self, request_id: str, generation: int) -> None: ...

    def heartbeat(self, request_id: str, generation: int) -> None: ...


class BadRequest(Exception):
    """A well-formed frame asking for something malformed (a missing or mistyped field)."""


class SideChannelServer:
    """A TCP server thread answering side channel requests from ``source``; bound at once
    (``port`` 0 picks a free port; ``self.port`` is the one bound)."""

    def __init__(self, host: str, port: int, source: BlockSource) -> None:
        self.source = source
        self._server = _ThreadingServer((host, port), _Handler)
        self._server.side_channel = self
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
            name=f"kv-side-channel-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, close every open connection, and wait for the serving thread."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self._server.close_connections()

    def answer(self, header: dict[str, Any]) -> Frame:
        """The reply to one request frame (errors become error frames)."""
        try:
            return self._dispatch(header)
        except LeaseExpired as error:
            return _error("gone", str(error))
        except BadRequest as error:
            return _error("bad_request", str(error))
        except Exception as error:  # a source's failure must not end the connection thread
            logger.exception("the KV side channel failed to answer %r", header.get("op"))
            return _error("internal", f"{type(error).__name__}: {error}")

    def _dispatch(self, header: dict[str, Any]) -> Frame:
        op = header["op"]
        if op == "metadata":
            return Frame({"op": "metadata", "metadata": self.source.metadata()})
        if op not in ("read", "free", "heartbeat"):
            raise BadRequest(f"unknown op {op!r}")
        request_id, generation = _lease_fields(header)
        if op == "read":
            block_ids, digest = header.get("block_ids"), header.get("prompt_digest")
            if not isinstance(block_ids, list) or not all(_is_int(b) for b in block_ids):
                raise BadRequest("'block_ids' is not a list of integers")
            if not isinstance(digest, str):
                raise BadRequest("'prompt_digest' (a string) is required")
            payload = self.source.read(request_id, generation, block_ids, digest)
            return Frame({"op": "blocks"}, list(payload.layers))
        if op == "free":
            self.source.free(request_id, generation)
        else:
            self.source.heartbeat(request_id, generation)
        return Frame({"op": "ok"})


class _ThreadingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    side_channel: SideChannelServer

    def __init__(self, address: tuple[str, int], handler: type) -> None:
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        self.address_family = address_family(*address)
        super().__init__(address, handler)

    def track(self, sock: socket.socket, open_now: bool) -> None:
        with self._open_lock:
            (self._open.add if open_now else self._open.discard)(sock)

    def close_connections(self) -> None:
        with self._open_lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Handler(socketserver.BaseRequestHandler):
    """One connection: frames answered in order until the client closes it."""

    server: _ThreadingServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(IDLE_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(sock, True)
        try:
            self._serve(sock)
        except (OSError, ConnectionClosed):
            pass  # the client went away (or the server is closing)
        finally:
            self.server.track(sock, False)

    def _serve(self, sock: socket.socket) -> None:
        side_channel = self.server.side_channel
        while True:
            try:
                frame = recv_frame(  # requests carry no tensors
                    sock, max_bytes=0, max_header_bytes=MAX_REQUEST_HEADER_BYTES, max_tensors=0
                )
            except ProtocolError as error:
                logger.warning(
                    "KV side channel: a bad frame from %s: %s", self.client_address, error
                )
                reply = _error("bad_request", f"malformed frame: {error}")
                send_frame(sock, reply.header)
                return  # the stream may be out of step: close it
            reply = side_channel.answer(frame.header)
            try:
                send_frame(sock, reply.header, reply.tensors)
            except (TypeError, ValueError) as error:  # found before any byte is sent
                logger.exception("the KV side channel cannot encode its answer")
                send_frame(sock, _error("internal", f"cannot encode the answer: {error}").header)


@dataclass(frozen=True)
class ReplyLimits:
    """What one call accepts back (None: the client's defaults)."""

    max_bytes: int | None = None  # tensor bytes
    max_tensors: int | None = None
    timeout: float | None = None  # seconds to connect, and for each socket operation


class SideChannelClient:
    """Calls on one prefill engine's side channel (thread-safe; connections reused)."""

    def __init__(
        self, host: str, port: int, timeout: float = 60.0, max_frame_bytes: int = MAX_FRAME_BYTES
    ) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.max_frame_bytes = max_frame_bytes
        self._idle: list[socket.socket] = []
        self._in_use: set[socket.socket] = set()
        self._closed = False
        self._lock = threading.Lock()

    def metadata(self) -> dict:
        reply = self._call({"op": "metadata"})
        metadata = reply.header.get("metadata")
        if not isinstance(metadata, dict):
            raise TransferFailed(f"{self._peer()} sent metadata that is not an object")
        return metadata

    def read(
        self,
        request_id: str,
        generation: int,
        block_ids: list[int],
        digest: str,
        layout: KVLayout | None = None,
    ) -> BlockPayload:
        """The blocks of a lease, for a prompt whose ``prompt_digest`` is ``digest``; with
        ``layout`` (this engine's, which the peer's matched), a reply declaring more than
        those blocks' bytes or layers is refused before anything is allocated for it."""
        header = {"op": "read", "request_id": request_id, "generation": generation}
        limits = ReplyLimits()
        if layout is not None:
            limits = ReplyLimits(len(block_ids) * layout.block_bytes, layout.num_layers)
        request = {**header, "block_ids": list(block_ids), "prompt_digest": digest}
        reply = self._call(request, limits)
        if reply.header["op"] != "blocks":
            raise TransferFailed(f"{self._peer()} answered a read with {reply.header['op']!r}")
        return BlockPayload(reply.tensors)

    def free(self, request_id: str, generation: int) -> None:
        """Tell the prefill engine to free the blocks now (best effort: never raises)."""
        try:
            self._call({"op": "free", "request_id": request_id, "generation": generation})
        except TransferFailed as error:
            logger.debug("freeing %s's blocks on %s failed: %s", request_id, self._peer(), error)

    def heartbeat(self, request_id: str, generation: int, timeout: float | None = None) -> None:
        """Extend a lease; ``timeout`` bounds the connect and the answer (default: the
        client's)."""
        header = {"op": "heartbeat", "request_id": request_id, "generation": generation}
        self._call(header, ReplyLimits(timeout=timeout))

    def close(self) -> None:
        """Close the idle connections, and end the calls in flight (they fail at once)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            in_use = list(self._in_use)
        for sock in idle:
            sock.close()
        for sock in in_use:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _call(self, header: dict[str, Any], limits: ReplyLimits | None = None) -> Frame:
        """One request and its reply; a reused connection the server has dropped since is
        retried once on a new one. Error replies raise."""
        limits = limits or ReplyLimits()
        timeout = self.timeout if limits.timeout is None else limits.timeout
        sock, reused = self._connection(timeout)
        try:
            reply = self._exchange(sock, header, limits)
        except (ConnectionClosed, ConnectionError) as error:
            self._forget(sock)
            if not reused:
                raise TransferFailed(f"{self._peer()} closed the connection: {error}") from None
            sock, _ = self._connection(timeout, fresh=True)
            reply = self._exchange_once(sock, header, limits)
        self._release(sock)
        return _raise_error(reply, self._peer())

    def _exchange_once(self, sock: socket.socket, header: dict[str, Any], limits) -> Frame:
        try:
            return self._exchange(sock, header, limits)
        except (ConnectionClosed, ConnectionError) as error:
            self._forget(sock)
            raise TransferFailed(f"{self._peer()} closed the connection: {error}") from None

    def _exchange(self, sock: socket.socket, header: dict[str, Any], limits) -> Frame:
        max_bytes = self.max_frame_bytes if limits.max_bytes is None else limits.max_bytes
        try:
            send_frame(sock, header)
            return recv_frame(sock, max_bytes, max_tensors=limits.max_tensors)
        except (ConnectionClosed, ConnectionError):
            raise
        except (ProtocolError, OSError, ValueError) as error:
            self._forget(sock)
            raise TransferFailed(f"{self._peer()}: {type(error).__name__}: {error}") from None

    def _connection(self, timeout: float, fresh: bool = False) -> tuple[socket.socket, bool]:
        """An idle connection (reused: True) or a new one, in use until released, answering
        within ``timeout`` seconds."""
        sock, reused = None, False
        if not fresh:
            with self._lock:
                if self._idle:
                    sock, reused = self._idle.pop(), True
        if sock is None:
            address = (self.host, self.port)
            try:
                sock = socket.create_connection(address, timeout=min(CONNECT_TIMEOUT, timeout))
            except OSError as error:
                raise TransferFailed(f"cannot connect to {self._peer()}: {error}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)
        with self._lock:
            self._in_use.add(sock)
        return sock, reused

    def _release(self, sock: socket.socket) -> None:
        with self._lock:
            self._in_use.discard(sock)
            if len(self._idle) < MAX_IDLE_CONNECTIONS and not self._closed:
                self._idle.append(sock)
                return
        sock.close()

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._in_use.discard(sock)
        sock.close()

    def _peer(self) -> str:
        return f"the KV side channel at {self.host}:{self.port}"


def address_family(host: str, port: int) -> socket.AddressFamily:
    """The family to listen on ``host`` with: IPv4 when it has an IPv4 address (a name such
    as ``localhost`` keeps listening where it did), else IPv6 (a pod's IPv6 literal)."""
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return socket.AF_INET  # binding then fails, naming the address
    families = [family for family, *_ in found]
    return socket.AF_INET if socket.AF_INET in families or not families else families[0]


def _raise_error(reply: Frame, peer: str) -> Frame:
    """``reply`` unless it is an error frame: ``BlocksGone`` or ``TransferFailed`` then."""
    if reply.header["op"] != "error":
        return reply
    kind, message = reply.header.get("error"), reply.header.get("message", "")
    if kind == "gone":
        raise BlocksGone(f"{peer}: {message}")
    raise TransferFailed(f"{peer} answered {kind}: {message}")


def _error(kind: str, message: str) -> Frame:
    return Frame({"op": "error", "error": kind, "message": message})


def _lease_fields(header: dict[str, Any]) -> tuple[str, int]:
    request_id, generation = header.get("request_id"), header.get("generation")
    if not isinstance(request_id, str) or not _is_int(generation):
        raise BadRequest("'request_id' (a string) and 'generation' (an integer) are required")
    return request_id, generation


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
