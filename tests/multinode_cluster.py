"""A multi-node engine on one machine for tests: a leader ``octavo serve`` and its
``--headless`` worker hosts as real processes on 127.0.0.1 (each in its own session, so
a whole "host" can be killed at once)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

NODE_KEY = "multinode-test-secret"
EXIT_WITHIN_SECONDS = 60  # a failed leader (or host) exits this fast, busy CPUs included
# A small fp32 engine, one thread per rank: what every host of a test group runs with.
SMALL_ENGINE_FLAGS = [
    *("--dtype", "float32", "--max-model-len", "384"),
    *("--kv-cache-memory", "8MiB", "--num-threads", "1"),
]
SERVED_NAME = "tiny"


def free_port_pair() -> int:
    """A port P with P and P + 1 free on every address (the node port and torch's), below the
    kernel's ephemeral range: a port from that range can be taken between this probe and
    the bind by the source port of any outgoing connection (the worker hosts' own
    connections to P included), which made torch's store fail with EADDRINUSE."""
    low, _ = ephemeral_port_range()
    ports = range(max(1024, low - 12000), max(1025, low - 1))
    candidates = random.Random(os.getpid() ^ time.monotonic_ns()).sample(
        ports, min(200, len(ports))
    )
    for port in candidates:
        with contextlib.suppress(OSError), socket.socket() as first, socket.socket() as second:
            first.bind(("", port))
            second.bind(("", port + 1))
            return port
    raise RuntimeError("no two consecutive free ports below the ephemeral range")


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux's default if the
    file is absent)."""
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    with contextlib.suppress(OSError, ValueError):
        low, high = path.read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Host:
    """One process of the group: its command's process and its log."""

    process: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            from stuck_processes import stuck  # not at the top: e2e imports this module too

            message = stuck(self.process.pid, self.log, f"still running after {timeout:.1f} s")
            raise AssertionError(message) from None

    def kill_host(self) -> None:
        """SIGKILL every process of this "host" (its session)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


@dataclass
class NodeGroup:
    """The flags every host shares, and the hosts started so far."""

    model: Path
    workdir: Path
    common: list[str]
    master_port: int = field(default_factory=free_port_pair)
    hosts: list[Host] = field(default_factory=list)
    url: str = ""

    def flags(self, node_rank: int, *extra: str) -> list[str]:
        return [
            *self.common,
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(self.master_port),
            "--node-rank",
            str(node_rank),
            *extra,
        ]

    def start_leader(self, *extra: str) -> Host:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        args = ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME]
        return self._start("leader", self.flags(0, *args, *extra))

    def start_worker(self, node_rank: int, *extra: str, key: str = NODE_KEY) -> Host:
        return self._start(f"node{node_rank}", self.flags(node_rank, "--headless", *extra), key)

    def _start(self, name: str, flags: list[str], key: str = NODE_KEY) -> Host:
        env = {
            **os.environ,
            "OCTAVO_NODE_KEY": key,
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
        }
        log = self.workdir / f"{name}.log"
        command = [sys.executable, "-m", "octavo.cli", "serve", str(self.model), *flags]
        with log.open("w") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        host = Host(process, log)
        self.hosts.append(host)
        return host

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for host in self.hosts:
                assert host.process.poll() is None, f"{host.log.name} exited:\n{self.logs()}"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise AssertionError(f"not healthy in {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        from stuck_processes import log_tail  # not at the top: e2e imports this module too

        return "\n".join(f"--- {h.log.name}\n{log_tail(h.log, 60)}" for h in self.hosts)

    def stop_all(self) -> None:
        for host in self.hosts:
            host.kill_host()
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.process.wait(timeout=10)


@contextlib.contextmanager
def node_group(model: Path, workdir: Path, common: list[str]) -> Iterator[NodeGroup]:
    group = NodeGroup(model, workdir, common)
    try:
        yield group
    finally:
        group.stop_all()


def greedy_token_ids(url: str, prompt: list[int], max_tokens: int) -> list[int]:
    """The served model's greedy completion of ``prompt`` as token ids (the server runs
    with --return-tokens-as-token-ids, so logprobs name every token by its id)."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    tokens = reply.json()["choices"][0]["logprobs"]["tokens"]
    return [int(token.removeprefix("token_id:")) for token in tokens]


def descendants(pid: int) -> list[psutil.Process]:
    """Every process under ``pid`` (a host's workers, the engine core's among them)."""
    return psutil.Process(pid).children(recursive=True)


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_gone(processes: list[psutil.Process]) -> None:
    deadline = time.monotonic() + 10
    while not all(gone(process) for process in processes):
        assert time.monotonic() < deadline, "worker processes left behind"
        time.sleep(0.05)
