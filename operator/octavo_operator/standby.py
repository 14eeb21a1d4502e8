"""/healthz for a standby replica: it is alive while it waits for the Lease, so the
kubelet must not restart it; kopf serves the same path once this replica leads."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path.split("?")[0] == "/healthz"
        body = json.dumps({"standby": True} if ok else {"error": "not found"}).encode()
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:  # probes every few seconds: not logged
        return


class StandbyHealth:
    """``with StandbyHealth(port):`` serves /healthz on ``port`` (0: nothing) meanwhile."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server: ThreadingHTTPServer | None = None

    def __enter__(self) -> StandbyHealth:
        if self.port:
            self.server = ThreadingHTTPServer(("0.0.0.0", self.port), _Handler)
            threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()  # the port is kopf's next
