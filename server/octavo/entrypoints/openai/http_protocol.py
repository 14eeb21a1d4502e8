"""uvicorn's HTTP/1.1 protocol (h11), plus a deadline for each request head.

uvicorn has no such deadline: a client that opens a connection and sends its headers a
byte at a time (or nothing at all) holds the connection forever, and enough of them
exhaust the server (slowloris). Here a connection that has not completed a request head
within ``header_timeout`` seconds of opening (or of its first byte after a finished
response) is closed. Idle keep-alive connections are still closed by uvicorn's own
``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadlineProtocol(H11Protocol):
    """Closes connections whose request head does not arrive within ``header_timeout``."""

    header_timeout: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._awaiting_head():
            if self._header_timer is None:
                self._start_header_timer()
        else:
            self._stop_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _awaiting_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _start_header_timer(self) -> None:
        self._stop_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._awaiting_head():
            self.logger.info("closing a connection that sent no request head in time")
            self.transport.close()


def protocol_with_header_timeout(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": seconds})
