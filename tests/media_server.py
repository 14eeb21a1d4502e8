"""A loopback HTTP server (stdlib ``http.server`` in a thread) serving test images.

Paths: ``/cat.png`` (the image), ``/slow.png`` (answers after ``SLOW_SECONDS``),
``/huge.png`` (``HUGE_BYTES`` without a Content-Length), ``/huge-declared.png`` (a
Content-Length over any small cap), ``/redirect-in`` (302 to ``/cat.png``, with a
cookie), ``/redirect-out`` (302 to the same port under the name ``localhost``),
``/missing`` (404). Every request's Cookie and Authorization headers are recorded.
"""

from __future__ import annotations

import contextlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_SECONDS = 6.0
HUGE_BYTES = 1 << 20
CHUNK = 16 * 1024


class MediaServer:
    """``with MediaServer(png_bytes) as media: media.url("/cat.png")``."""

    def __init__(self, image: bytes) -> None:
        self.image = image
        self.credentials_seen: list[str] = []  # Cookie / Authorization headers received
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> MediaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler_for(media: MediaServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            media.credentials_seen += [
                f"{name}: {self.headers[name]}"
                for name in ("Cookie", "Authorization")
                if self.headers[name]
            ]
            # the client may stop reading (the byte cap, the deadline)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._answer()

        def _answer(self) -> None:
            if self.path == "/cat.png":
                self._send(200, media.image)
            elif self.path == "/slow.png":
                time.sleep(SLOW_SECONDS)
                self._send(200, media.image)
            elif self.path == "/huge.png":
                self._send_unsized(HUGE_BYTES)
            elif self.path == "/huge-declared.png":
                self._send(200, b"", {"Content-Length": str(HUGE_BYTES)})
            elif self.path == "/redirect-in":
                self._send(302, b"", {"Location": "/cat.png", "Set-Cookie": "session=secret"})
            elif self.path == "/redirect-out":
                self._send(302, b"", {"Location": media.url("/cat.png", "localhost")})
            else:
                self._send(404, b"not here")

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            headers = {"Content-Length": str(len(body)), **(headers or {})}
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _send_unsized(self, size: int) -> None:
            """HTTP/1.0: the body ends when the connection closes, no length announced."""
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            for _ in range(size // CHUNK):
                self.wfile.write(bytes(CHUNK))

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet

    return Handler
