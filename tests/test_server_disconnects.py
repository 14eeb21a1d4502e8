"""50 streaming clients leave mid-stream: every request is aborted, its KV blocks freed,
and /metrics shows an idle engine (no running requests, KV cache usage 0)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from octavo.entrypoints.openai.context import ServerConfig

from server_harness import (
    EngineControl,
    ThreadedServer,
    build_local_app,
    metric_value,
    torch_threads,
)

MODEL = "tiny"
NUM_CLIENTS = 50
MAX_TOKENS = 1500  # far more than can be generated before the clients leave
CHUNKS_READ = 2
SETTLE_SECONDS = 20.0


@pytest.fixture(scope="module")
def running(tiny_folder) -> Iterator[tuple[ThreadedServer, EngineControl]]:
    control = EngineControl()
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    app = build_local_app(
        str(tiny_folder("llama3")),
        config,
        on_engine=control.attach,
        max_model_len=2048,
        kv_cache_memory=16 << 20,
        max_num_seqs=64,
    )
    with torch_threads(1), ThreadedServer(app) as server:
        yield server.wait_ready(), control


def stream_request(index: int) -> tuple[str, dict[str, Any]]:
    """Alternate completions and chat; every fifth asks for two choices."""
    common = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    common["n"] = 2 if index % 5 == 0 else 1
    if index % 2:
        return "/v1/completions", {"prompt": f"Client {index} says", **common}
    messages = [{"role": "user", "content": f"Client {index}, talk forever."}]
    return "/v1/chat/completions", {"messages": messages, **common}


async def read_then_leave(client: httpx.AsyncClient, index: int, started: asyncio.Event) -> int:
    """Open a stream, read a couple of events, then close the connection mid-stream."""
    path, body = stream_request(index)
    events = 0
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            events += line.startswith("data: ")
            if events >= CHUNKS_READ:
                await started.wait()  # keep all 50 open until every one is streaming
                break
    return events


async def fifty_clients(url: str) -> list[int]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS + 5)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        started = asyncio.Event()
        tasks = [
            asyncio.create_task(read_then_leave(client, index, started))
            for index in range(NUM_CLIENTS)
        ]
        await wait_streaming(client, NUM_CLIENTS)
        started.set()
        return await asyncio.gather(*tasks)


async def wait_streaming(client: httpx.AsyncClient, expected: int) -> None:
    """Until the server reports ``expected`` requests running (bounded)."""
    deadline = time.monotonic() + 60
    while True:
        scrape = (await client.get("/metrics")).text
        if metric_value(scrape, "vllm:num_requests_running") >= expected:
            return
        assert time.monotonic() < deadline, "the 50 streams never all ran"
        await asyncio.sleep(0.05)


def poll_metrics(url: str, condition: Any) -> str:
    """Scrape /metrics until ``condition(text)`` holds; return the last scrape."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        if condition(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def is_idle(text: str) -> bool:
    return (
        metric_value(text, "vllm:num_requests_running") == 0
        and metric_value(text, "vllm:num_requests_waiting") == 0
        and metric_value(text, "vllm:kv_cache_usage_perc") == 0
    )


def test_fifty_clients_leaving_mid_stream_leave_nothing_behind(running):
    server, control = running
    before = httpx.get(f"{server.url}/metrics").text
    aborted_before = aborts(before)
    events = asyncio.run(fifty_clients(server.url))
    assert events == [CHUNKS_READ] * NUM_CLIENTS
    text = poll_metrics(server.url, is_idle)
    assert metric_value(text, "vllm:num_requests_running") == 0
    assert metric_value(text, "vllm:num_requests_waiting") == 0
    assert metric_value(text, "vllm:kv_cache_usage_perc") == 0
    text = poll_metrics(server.url, lambda text: aborts(text) - aborted_before >= NUM_CLIENTS)
    assert aborts(text) - aborted_before == NUM_CLIENTS
    assert control.is_idle(), "requests or KV blocks left in the engine"
    after = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": "still serving", "max_tokens": 3, "ignore_eos": True},
        timeout=30,
    )
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert is_idle(poll_metrics(server.url, is_idle))


def aborts(text: str) -> float:
    try:
        return metric_value(text, "vllm:request_success_total", finished_reason="abort")
    except KeyError:
        return 0.0
