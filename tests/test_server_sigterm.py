"""`octavo serve` as a real process: SIGTERM drains in-flight requests, then exits 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

STARTUP_SECONDS = 120
# Generous: the CPU may be shared, and the in-flight request must finish, not be aborted.
SHUTDOWN_TIMEOUT = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(process: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited during startup"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail("the server did not become healthy")


@pytest.fixture
def serve_process(tiny_folder):
    port = free_port()
    command = [
        sys.executable, "-m", "octavo.cli", "serve", str(tiny_folder("llama3")),
        "--host", "127.0.0.1", "--port", str(port), "--shutdown-timeout", str(SHUTDOWN_TIMEOUT),
        "--max-model-len", "256", "--kv-cache-memory", "4MiB", "--log-level", "warning",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def read_stream(url: str, started: threading.Event, lines: list[str]) -> None:
    body = {"prompt": "Drain", "max_tokens": 120, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=90) as response:
        for line in response.iter_lines():
            if line:
                lines.append(line)
                started.set()


def test_sigterm_drains_then_exits_zero(serve_process):
    process, url = serve_process
    wait_healthy(process, url)
    started, lines = threading.Event(), []
    reader = threading.Thread(target=read_stream, args=(url, started, lines), daemon=True)
    reader.start()
    assert started.wait(30), "the streaming request did not start"
    process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while httpx.get(f"{url}/health", timeout=5).status_code != 503:
        assert time.monotonic() < deadline, "/health did not turn 503"
    refused = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, timeout=5)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "draining"
    reader.join(SHUTDOWN_TIMEOUT)
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2].removeprefix("data: "))
    assert final["choices"][0]["finish_reason"] == "length"  # finished, not aborted
    assert process.wait(timeout=SHUTDOWN_TIMEOUT) == 0, process.stdout.read().decode()
