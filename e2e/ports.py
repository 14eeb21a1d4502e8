"""Ports for the processes the e2e suite starts (operators, pods, pickers, controllers).

Each one is probed free on every address (the activator and the pods listen on 0.0.0.0),
taken below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range: the
source ports of the suite's many client connections, which took a probed port before its
server bound it) and never handed out twice by this process (two operators started side by
side were once given the same port the kernel had just freed)."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # above the well-known and registered ports most services take

_handed_out: set[int] = set()
_lock = threading.Lock()


def ephemeral_start() -> int:
    try:
        return int(RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _binds(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port nothing is bound to, outside the ephemeral range, new to this process."""
    top = ephemeral_start() - 1
    low = LOWEST if top > LOWEST + 1000 else 1024
    with _lock:
        for _ in range(1000):
            port = random.randint(low, top)
            if port not in _handed_out and _binds(port):
                _handed_out.add(port)
                return port
    raise OSError(f"no free port in {low}-{top} after 1000 tries")


def free_ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]
