"""Starting and stopping the servers ``python -m octavo_bench serve`` launches itself.

``--launch`` runs ``octavo serve``, ``--baseline hf`` the naive HF server and ``--baseline
vllm`` vLLM's OpenAI server (with the python of its own venv), each as a child process on
a free loopback port with its output in a log file; the benchmark waits for ``/health``
to answer 200 and stops the child (its whole process group) with SIGTERM at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

LOOPBACK = "127.0.0.1"
STOP_TIMEOUT_S = 45.0  # octavo serve drains in-flight requests for up to 30 s by default
LOG_TAIL_CHARS = 3000


class LaunchError(RuntimeError):
    """A launched server exited or did not become healthy in time."""


@dataclass
class ChildServer:
    name: str
    process: subprocess.Popen
    port: int
    log_path: Path
    startup_s: float = 0.0  # start to healthy
    host: str = LOOPBACK

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def octavo_serve_command(
    port: int,
    model_path: str | None,
    dtype: str | None,
    extra: Sequence[str] = (),
    host: str = LOOPBACK,
) -> list[str]:
    """``octavo serve`` through this interpreter, on loopback only, without access logs."""
    command = [sys.executable, "-m", "octavo.cli", "serve"]
    if model_path:
        command.append(str(model_path))
    command += ["--host", host, "--port", str(port), "--log-level", "warning"]
    if dtype:
        command += ["--dtype", dtype]
    return command + list(extra)


def hf_server_command(
    port: int, model_path: str | Path, dtype: str, device: str = "cpu"
) -> list[str]:
    module = "octavo_bench.serve_hf_server"
    flags = ["--host", LOOPBACK, "--port", str(port), "--dtype", dtype, "--device", device]
    return [sys.executable, "-m", module, str(model_path), *flags]


def vllm_server_command(
    python: str,
    port: int,
    model_path: str | Path,
    served_name: str,
    dtype: str,
    max_model_len: int | None,
) -> list[str]:
    """vLLM's OpenAI server from its own venv's python, on loopback, serving ``served_name``."""
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path)]
    command += ["--served-model-name", served_name, "--dtype", dtype]
    if max_model_len is not None:
        command += ["--max-model-len", str(max_model_len)]
    return [*command, "--host", LOOPBACK, "--port", str(port)]


def wait_healthy(server: ChildServer, timeout_s: float) -> None:
    """Poll ``/health`` until it answers 200; raise if the child exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise LaunchError(
                    f"{server.name} exited with code {server.process.returncode} while "
                    f"starting; the end of {server.log_path}:\n{server.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(server.base_url + "/health").status_code == 200:
                    return
            time.sleep(0.5)
    raise LaunchError(f"{server.name} was not healthy after {timeout_s:.0f} s")


def stop(server: ChildServer) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``STOP_TIMEOUT_S``; each to the
    child's process group (its own session), so workers it spawned (vLLM's) go too."""
    if server.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    with contextlib.suppress(ProcessLookupError):  # stragglers of the group
        os.killpg(server.process.pid, signal.SIGKILL)


@contextlib.contextmanager
def child_server(
    name: str,
    command: list[str],
    port: int,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    host: str = LOOPBACK,
) -> Iterator[ChildServer]:
    """Run ``command`` (a server on ``port``) for the duration of the ``with`` block."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        start = time.monotonic()
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=os.environ if env is None else env,
            start_new_session=True,
        )
        server = ChildServer(name, process, port, log_path, host=host)
        try:
            print(f"starting {name} on {server.base_url} (log: {log_path})", flush=True)
            wait_healthy(server, timeout_s)
            server.startup_s = time.monotonic() - start
            print(f"{name} healthy after {server.startup_s:.0f} s", flush=True)
            yield server
        finally:
            stop(server)
