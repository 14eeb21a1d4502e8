"""Connections: slow-header clients are cut off (issue: 50 connections sending their headers
slowly were held 60 s), and past --limit-concurrency API requests get 503 while the probes
still answer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from octavo.entrypoints.openai.context import ServerConfig

from server_harness import (
    LOOPBACK,
    EngineControl,
    ThreadedServer,
    build_local_app,
    metric_value,
    torch_threads,
)

MODEL = "tiny"
HEADER_TIMEOUT = 1.0
LIMIT = 2
NUM_SLOW_CLIENTS = 50
CLOSED_WITHIN_SECONDS = HEADER_TIMEOUT + 2.0


@pytest.fixture(scope="module")
def running(tiny_folder) -> Iterator[tuple[ThreadedServer, EngineControl]]:
    control = EngineControl()
    config = ServerConfig(
        served_model_names=[MODEL],
        model_root=MODEL,
        header_timeout=HEADER_TIMEOUT,
        limit_concurrency=LIMIT,
    )
    app = build_local_app(
        str(tiny_folder("llama3")),
        config,
        on_engine=control.attach,
        max_model_len=256,
        kv_cache_memory=8 << 20,
    )
    with torch_threads(1), ThreadedServer(app) as server:
        yield server.wait_ready(), control


def slow_client(port: int) -> socket.socket:
    """A connection that starts a request and never finishes its headers."""
    sock = socket.create_connection((LOOPBACK, port), timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    return sock


def closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """True once the server closes the connection (EOF or reset) before ``deadline``."""
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_header_connections_are_closed_and_health_stays_fast(running):
    server, _ = running
    sockets = [slow_client(server.port) for _ in range(NUM_SLOW_CLIENTS)]
    opened = time.monotonic()
    try:
        for sock in sockets[:10]:  # a byte now and then does not extend the deadline
            sock.sendall(b"a")
        started = time.perf_counter()
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        assert time.perf_counter() - started < 0.5
        deadline = opened + CLOSED_WITHIN_SECONDS
        still_open = [sock for sock in sockets if not closed_by_server(sock, deadline)]
        assert not still_open, f"{len(still_open)} slow connections were still open"
        assert time.monotonic() - opened >= HEADER_TIMEOUT * 0.9  # not closed too early
    finally:
        for sock in sockets:
            sock.close()
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_idle_connection_that_sends_nothing_is_closed(running):
    server, _ = running
    with socket.create_connection((LOOPBACK, server.port), timeout=10) as sock:
        assert closed_by_server(sock, time.monotonic() + CLOSED_WITHIN_SECONDS)


def test_a_prompt_request_is_answered_on_a_kept_alive_connection(running):
    server, _ = running
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(2):  # the header deadline never hits a well-behaved client
            body = {"prompt": "hi", "max_tokens": 2}
            assert client.post("/v1/completions", json=body).status_code == 200
            time.sleep(HEADER_TIMEOUT * 0.6)


def test_past_the_concurrency_limit_api_requests_get_503_and_probes_answer(running):
    server, control = running
    control.paced.set()
    body = {"prompt": "busy", "max_tokens": 60, "ignore_eos": True}
    results: list[int] = []
    holders = [
        threading.Thread(
            target=lambda: results.append(
                httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code
            )
        )
        for _ in range(LIMIT)
    ]
    try:
        for thread in holders:
            thread.start()
        wait_running(server.url, LIMIT)
        refused = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "overloaded"
        assert refused.headers["retry-after"] == "1"
        for path in ("/health", "/metrics", "/version"):
            assert httpx.get(server.url + path, timeout=5).status_code == 200, path
    finally:
        control.paced.clear()
        for thread in holders:
            thread.join(timeout=60)
    assert results == [200] * LIMIT


def wait_running(url: str, expected: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(f"{url}/metrics", timeout=5).text
        if metric_value(text, "vllm:num_requests_running") >= expected:
            return
        assert time.monotonic() < deadline, "the requests never ran"
        time.sleep(0.02)
