"""A TCP port forwarder: what a pod's own network namespace gives, on one host.

In a pod, a server binds `tcp://*:5557` and is reached at `<pod IP>:5557`. Several
"pods" on one machine (the routed benchmark's replicas, e2e's loopback pods) cannot all
bind port 5557 on every address, and vLLM's KV-event publisher binds only wildcard
endpoints (a host address means "connect"). So each one binds `tcp://*:<free port>` and a
forwarder listens on `<its own loopback IP>:5557`, copying bytes both ways: the endpoint
picker dials the address it would dial in a cluster and ZMQ runs unchanged over it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

CHUNK = 65536


def pump(source: socket.socket, target: socket.socket) -> None:
    """Copy SOURCE to TARGET until either side closes, then close both."""
    try:
        while data := source.recv(CHUNK):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@dataclass
class PortForward:
    listen: tuple[str, int]  # (host, port) clients dial
    target: tuple[str, int]  # (host, port) the server really listens on
    _server: socket.socket | None = field(default=None, repr=False)

    def start(self) -> PortForward:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(self.listen)
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name=f"forward {self.listen}").start()
        return self

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(source, target), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
