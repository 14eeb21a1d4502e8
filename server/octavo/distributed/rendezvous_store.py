"""torch.distributed's key-value store, listening only where it must and only while it must.

``init_process_group(init_method="tcp://host:port")`` makes rank 0 a ``TCPStore`` server
that listens on every interface, whatever ``host`` is, unauthenticated, for the engine's
whole life: anyone who reaches the port can read and write its keys (a probe stored
1000 MiB in it). So rank 0 builds the store itself on a socket bound to the rendezvous
address only (``host``: 127.0.0.1 on one host, ``--master-addr`` across hosts), handed to
torch as ``master_listen_fd``. The master store returns once every rank has connected;
with gloo (CPU) that listener is then closed: the ranks keep their connections, which is
all the groups and collectives use afterwards. NCCL (GPU) builds its communicators later,
over the store, so there the listener stays open (bound to the rendezvous address).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from urllib.parse import urlsplit

import torch.distributed as dist


def open_store(
    init_method: str, rank: int, world_size: int, timeout: timedelta, close_listener: bool
) -> dist.TCPStore:
    """This rank's store of the ``tcp://host:port`` rendezvous: the server on rank 0 (bound
    to ``host`` only; ``close_listener``: closed once every rank is in), a client elsewhere."""
    host, port = rendezvous_address(init_method)
    if rank != 0:
        return dist.TCPStore(host, port, world_size, False, timeout)
    listener = _listen(host, port)
    fd = listener.detach()  # the store owns the socket from here
    store = dist.TCPStore(
        host, port, world_size, True, timeout, master_listen_fd=fd, use_libuv=True
    )  # returns once all ``world_size`` ranks have connected
    if close_listener:
        _close_listener(fd)
    return store


def rendezvous_address(init_method: str) -> tuple[str, int]:
    """``(host, port)`` of ``tcp://host:port`` (``[v6]`` brackets removed); ValueError."""
    parts = urlsplit(init_method)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ValueError(f"the workers' rendezvous must be tcp://HOST:PORT, got {init_method!r}")
    return parts.hostname, parts.port


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` only (the first of its addresses that binds)."""
    errors = []
    for family, _, _, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        try:
            return socket.create_server(address[:2], family=family, backlog=128)
        except OSError as error:
            errors.append(f"{address[0]}: {error}")
    raise OSError(
        f"torch.distributed cannot listen on {host}:{port} ({'; '.join(errors) or 'no address'}):"
        " --master-addr must be an address of the leader and master_port + 1 must be free there"
    )


def _close_listener(fd: int) -> None:
    """Stop listening while the store keeps serving the connections it has: the listening
    socket is swapped for a blank one under the same descriptor (torch has no call to stop
    its server accepting; its event loop forgets a socket that is closed, and closes the
    blank one with the store)."""
    with socket.socket() as blank:
        os.dup2(blank.fileno(), fd, inheritable=False)
