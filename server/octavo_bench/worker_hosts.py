"""Worker hosts of a multi-node layout for the benchmarks: ``octavo serve --headless``
processes on 127.0.0.1, started before the leader's engine and stopped after it.

The leader is the benchmark's own ``LLM`` (``nnodes``/``node_rank=0``); each other "node"
is a real process that joins it over TCP, exactly as a LeaderWorkerSet worker pod does, so
the figures include the node channel (pickled step plans and outputs over TCP) and the
torch.distributed traffic between processes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NodeGroupFlags:
    """What the leader and its worker hosts must agree on."""

    nnodes: int
    master_port: int
    key: str

    def engine_kwargs(self) -> dict[str, object]:
        """The leader's ``LLM`` arguments."""
        return {
            "nnodes": self.nnodes,
            "node_rank": 0,
            "master_addr": "127.0.0.1",
            "master_port": self.master_port,
        }

    def worker_flags(self, node_rank: int) -> list[str]:
        return [
            *("--nnodes", str(self.nnodes), "--node-rank", str(node_rank)),
            *("--master-addr", "127.0.0.1", "--master-port", str(self.master_port)),
            "--headless",
        ]


def free_port_pair() -> int:
    """A port P with P and P + 1 free on loopback (the node port and torch's rendezvous)."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second, contextlib.suppress(OSError):
                second.bind(("127.0.0.1", port + 1))
                return port
    raise RuntimeError("no two consecutive free ports on loopback")


@contextlib.contextmanager
def worker_hosts(
    folder: Path, nnodes: int, engine_flags: list[str], log_dir: Path
) -> Iterator[NodeGroupFlags]:
    """Start hosts 1..nnodes-1 (headless) and yield the flags the leader must use."""
    group = NodeGroupFlags(nnodes, free_port_pair(), secrets.token_hex(16))
    os.environ["OCTAVO_NODE_KEY"] = group.key  # the leader (this process) reads it too
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = [
        _start_host(folder, group, rank, engine_flags, log_dir) for rank in range(1, nnodes)
    ]
    try:
        yield group
    finally:
        for process in processes:
            _stop(process)


def _start_host(
    folder: Path, group: NodeGroupFlags, rank: int, engine_flags: list[str], log_dir: Path
) -> subprocess.Popen:
    command = [sys.executable, "-m", "octavo.cli", "serve", str(folder), *engine_flags]
    command += group.worker_flags(rank)
    with (log_dir / f"node{rank}.log").open("w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))


def _stop(process: subprocess.Popen) -> None:
    """A headless host exits by itself after the leader's stop; kill it if it lingers."""
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
