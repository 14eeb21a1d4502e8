"""`octavo serve` runs the engine core in a process of its own; if it dies, the server
turns unhealthy and exits non-zero (so Kubernetes or Docker restarts it at once)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import httpx
import psutil
import pytest

from octavo.entrypoints.openai.server import ENGINE_DEATH_EXIT_CODE

from conftest import serve_subprocess

STARTUP_SECONDS = 120
EXIT_WITHIN_SECONDS = 30


@pytest.fixture(scope="module")
def server(tiny_folder, tmp_path_factory):
    """One server for the file: the first test only reads from it; the last kills its
    engine core (and so the server)."""
    tmp_path = tmp_path_factory.mktemp("engine-core-serve")
    args = ["--max-model-len", "256", "--kv-cache-memory", "8MiB", "--log-level", "warning"]
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    with serve_subprocess(tiny_folder("llama3"), tmp_path, args, STARTUP_SECONDS, env) as served:
        yield served


def engine_core_of(process: subprocess.Popen) -> psutil.Process:
    """The server's child that runs the engine (multiprocessing's spawn entry)."""
    children = psutil.Process(process.pid).children()
    cores = [c for c in children if any("spawn_main" in part for part in c.cmdline())]
    assert len(cores) == 1, [c.cmdline() for c in children]
    return cores[0]


def test_the_engine_core_is_its_own_process_and_serves(server):
    process, url, _ = server
    core = engine_core_of(process)
    assert core.pid != process.pid
    body = {"prompt": "Hello", "max_tokens": 5, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 5
    assert core.cpu_times().user > 0  # the model ran there


def test_the_servers_own_process_runs_without_torch(server):
    """HTTP, tokenizing and streaming need no torch: only the engine core loads it (the API
    process of a SmolLM2 server held 623 MB resident with torch, 142 MB without)."""
    process, url, _ = server
    body = {"prompt": "Hello", "max_tokens": 3, "logprobs": 2}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    mapped = {m.path for m in psutil.Process(process.pid).memory_maps()}
    assert not [path for path in mapped if "libtorch" in path]
    core_maps = {m.path for m in engine_core_of(process).memory_maps()}
    assert [path for path in core_maps if "libtorch_cpu" in path]  # the check can see torch


def wait_until_dead(core: psutil.Process, timeout: float = 10.0) -> None:
    """SIGKILL is asynchronous: the kernel may still be tearing the process down (freeing
    gigabytes of KV cache) for a while, and until then the parent rightly sees it alive.
    The main thread turns zombie before the other threads are gone, and the process's
    files (the pipe the parent watches) close only with the last thread: wait for both."""
    deadline = time.monotonic() + timeout
    with contextlib.suppress(psutil.NoSuchProcess):
        while core.status() != psutil.STATUS_ZOMBIE or _threads_left(core.pid) > 1:
            assert time.monotonic() < deadline, "the engine core survived SIGKILL"
            time.sleep(0.01)


def _threads_left(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:  # reaped already
        return 0


def test_engine_core_death_makes_the_server_unhealthy_and_exit_non_zero(server):
    process, url, log = server
    core = engine_core_of(process)
    os.kill(core.pid, signal.SIGKILL)
    wait_until_dead(core)
    deadline = time.monotonic() + EXIT_WITHIN_SECONDS
    while process.poll() is None:
        assert time.monotonic() < deadline, f"the server kept running:\n{log.read_text()}"
        with contextlib.suppress(httpx.TransportError):  # already closing
            assert httpx.get(f"{url}/health", timeout=2).status_code == 503
        time.sleep(0.05)
    assert process.returncode == ENGINE_DEATH_EXIT_CODE != 0
    assert "the engine core died" in log.read_text()
