"""`octavo serve --tensor-parallel-size 2` on CPU: two worker processes under the engine core.

The real openai client gets answers (plain and streamed) and /metrics counts them; a
killed worker makes /health answer 503 and the server exit non-zero (so the pod is
restarted, never left hanging); SIGTERM drains and leaves no worker behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from octavo.entrypoints.openai.server import ENGINE_DEATH_EXIT_CODE
from rank_processes import rank_processes
from stuck_processes import log_tail

from conftest import serve_subprocess
from health_probes import assert_unhealthy_within, probe_until_exit

STARTUP_SECONDS = 180
# A guard, not a budget: a CI machine running both suites took 30-35 s from the kill to the
# exit once (the engine core stopped its workers for 10 s, then was terminated).
EXIT_WITHIN_SECONDS = 60
UNHEALTHY_WITHIN_SECONDS = 1.5  # the workers' exits are watched, not polled between steps
TP_SERVER_ARGS = [
    *("--max-model-len", "256", "--kv-cache-memory", "8MiB"),
    *("--tensor-parallel-size", "2", "--served-model-name", "tiny"),
]


def tp_server(folder: Path, workdir: Path):
    """``octavo serve`` with two tensor-parallel workers, healthy (``serve_subprocess``)."""
    return serve_subprocess(folder, workdir, TP_SERVER_ARGS, STARTUP_SECONDS)


@pytest.fixture(scope="module")
def shared_tp_server(tiny_folder, tmp_path_factory):
    """One server for the tests that only read from it; the SIGTERM test, which runs after
    them, ends it."""
    workdir = tmp_path_factory.mktemp("shared-tp-server")
    with tp_server(tiny_folder("llama3"), workdir) as served:
        yield served


@pytest.fixture
def own_tp_server(tiny_folder, tmp_path):
    """A server of the test's own (the test kills one of its workers)."""
    with tp_server(tiny_folder("llama3"), tmp_path) as served:
        yield served


def workers_of(process: subprocess.Popen) -> list[psutil.Process]:
    return rank_processes(process.pid)


def gone(worker: psutil.Process) -> bool:
    try:
        return worker.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_serves_the_openai_client_streams_and_exports_metrics(shared_tp_server):
    process, url, _ = shared_tp_server
    assert len(workers_of(process)) == 2
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    completion = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    assert completion.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len(pieces) >= 2 and "".join(pieces)
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    generated = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:generation_tokens_total")
    ]
    assert generated and generated[0] >= 16


def test_sigterm_drains_and_leaves_no_worker(shared_tp_server):
    """Runs after the tests that read from the shared server: it ends it."""
    process, url, log = shared_tp_server
    workers = workers_of(process)
    assert len(workers) == 2
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 4, "ignore_eos": True}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(timeout=EXIT_WITHIN_SECONDS) == 0, log.read_text()
    deadline = time.monotonic() + 10
    while not all(gone(worker) for worker in workers):
        assert time.monotonic() < deadline, f"workers left behind:\n{log.read_text()}"
        time.sleep(0.05)


def test_a_dead_worker_makes_the_server_unhealthy_at_once_and_exit_non_zero(own_tp_server):
    process, url, log = own_tp_server
    victim = workers_of(process)[1]
    victim.kill()
    killed = time.monotonic()
    statuses = probe_until_exit(
        process,
        url,
        since=killed,
        limit=EXIT_WITHIN_SECONDS,
        describe=lambda: f"the server kept running:\n{log_tail(log)}",
    )
    exited = time.monotonic() - killed
    assert process.returncode == ENGINE_DEATH_EXIT_CODE != 0
    assert_unhealthy_within(statuses, exited, UNHEALTHY_WITHIN_SECONDS)
    text = log.read_text()
    assert f"worker 1 (pid {victim.pid}) exited" in text and "the engine core died" in text
