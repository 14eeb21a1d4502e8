"""A wedged rank fails the engine instead of hanging it (``--execute-model-timeout-seconds``).

A tensor-parallel worker stopped with SIGSTOP never answers the step (the other rank
waits for it in the all-reduce): once the bound has passed the step raises ``WorkerDied``
and both workers are gone, the stopped one killed. A whole worker host stopped under a
served leader: once the bound has passed the leader's /health turns 503, the request in
flight is answered, the leader exits 2 and, resumed, the host reads the leader's abort
and exits 2 too, leaving no worker behind. A send to a rank that stopped reading is
bounded as well."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection

import httpx
import psutil
import pytest

from octavo import LLM, SamplingParams
from octavo.entrypoints.openai.server import ENGINE_DEATH_EXIT_CODE
from octavo.executor.multiproc_executor import WorkerDied
from octavo.executor.step_timeout import TIMEOUT_FLAG, bound_sends
from rank_processes import rank_processes

from health_probes import health_until_exit
from multinode_cluster import (
    EXIT_WITHIN_SECONDS,
    SERVED_NAME,
    SMALL_ENGINE_FLAGS,
    Host,
    NodeGroup,
    assert_gone,
    node_group,
)

TIMEOUT_SECONDS = 2
# A served leader's first steps (its warm-ups) run while the host still starts: on a CI
# machine running both suites, rank 0 alone once took over 2 s for one of them.
SERVED_TIMEOUT_SECONDS = 10
STARTUP_SECONDS = 240


def overdue(seconds: int) -> str:
    return f"a step did not finish within {seconds} s ({TIMEOUT_FLAG}): ranks [0, 1]"


SMALL_ENGINE = {
    "dtype": "float32",
    "max_model_len": 384,
    "kv_cache_memory": 8 << 20,
    "num_threads": 1,
}


def workers_under(host: Host) -> list[psutil.Process]:
    return rank_processes(host.process.pid)


def ask(url: str) -> int | None:
    """A completion's status code; None when the server closed the connection instead."""
    body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4, "ignore_eos": True}
    with contextlib.suppress(httpx.TransportError):
        return httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code
    return None


def fails_after_the_bound(group: NodeGroup, leader: Host, pool: ThreadPoolExecutor) -> None:
    """A request starts a step that never finishes: the leader stays healthy until the
    bound has passed, then turns unhealthy (503 from then on, where a poll lands in the
    moment before it closes: on a loaded machine none may), answers the request and
    exits 2."""
    asked_at = time.monotonic()  # the step and its bound start later
    asked: Future = pool.submit(ask, group.url)
    statuses = health_until_exit(group, leader, since=asked_at, limit=EXIT_WITHIN_SECONDS)
    assert time.monotonic() - asked_at >= SERVED_TIMEOUT_SECONDS, statuses
    assert leader.process.returncode == ENGINE_DEATH_EXIT_CODE, group.logs()
    answered = [(seconds, status) for seconds, status in statuses if status is not None]
    assert all(
        seconds >= SERVED_TIMEOUT_SECONDS for seconds, status in answered if status != 200
    ), statuses
    first_503 = next((seconds for seconds, status in statuses if status == 503), None)
    if first_503 is not None:
        after = [status for seconds, status in answered if seconds >= first_503]
        assert all(status == 503 for status in after), statuses
    assert asked.result(timeout=30) != 200
    assert (
        overdue(SERVED_TIMEOUT_SECONDS) in leader.text() and "the engine core died" in leader.text()
    )


def test_a_stopped_tensor_parallel_worker_fails_the_step_and_is_killed(tiny_folder):
    llm = LLM(
        str(tiny_folder("llama3")),
        tensor_parallel_size=2,
        execute_model_timeout_seconds=TIMEOUT_SECONDS,
        **SMALL_ENGINE,
    )
    with llm:
        workers = [psutil.Process(w.process.pid) for w in llm.engine.executor.local_workers]
        workers[1].suspend()  # SIGSTOP: rank 0 waits for it in the all-reduce
        started = time.monotonic()
        with pytest.raises(WorkerDied, match=re.escape(overdue(TIMEOUT_SECONDS))):
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)
        assert TIMEOUT_SECONDS <= time.monotonic() - started < TIMEOUT_SECONDS + 20
        assert_gone(workers)


def test_a_stopped_worker_host_fails_the_engine_and_exits_2_when_resumed(tiny_folder, tmp_path):
    flags = [*SMALL_ENGINE_FLAGS, "--tensor-parallel-size", "2", "--nnodes", "2"]
    flags += [TIMEOUT_FLAG, str(SERVED_TIMEOUT_SECONDS)]
    with node_group(tiny_folder("llama3"), tmp_path, flags) as group, ThreadPoolExecutor(1) as pool:
        leader, host = group.start_leader(), group.start_worker(1)
        group.wait_healthy(STARTUP_SECONDS)
        workers = workers_under(leader) + workers_under(host)
        assert len(workers) == 2
        os.killpg(host.process.pid, signal.SIGSTOP)  # the whole host: agent and worker
        try:
            fails_after_the_bound(group, leader, pool)
        finally:
            os.killpg(host.process.pid, signal.SIGCONT)
        assert host.wait(30) == 2, group.logs()
        assert f"the leader's engine stopped: {overdue(SERVED_TIMEOUT_SECONDS)}" in host.text()
        assert_gone(workers)


def test_a_send_to_a_rank_that_stopped_reading_fails_instead_of_blocking():
    ours, theirs = socket.socketpair()
    conn = Connection(ours.detach())
    try:
        bound_sends(conn, 0.2)
        started = time.monotonic()
        with pytest.raises(OSError):
            conn.send_bytes(bytes(16 << 20))  # far beyond the socket's buffer; never read
        assert time.monotonic() - started < 5
    finally:
        conn.close()
        theirs.close()
