"""A request the engine fails (a final output with ``error`` set) reaches its client as an
error, a 500 or an SSE error event, while the requests beside it are served as usual."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from conftest import EngineFaults, faulty_tiny_server
from server_harness import (
    EngineControl,
)

MODEL = "tiny"
FAILING = {"seed": EngineFaults.FAIL_SEED, "max_tokens": 20, "ignore_eos": True}
HEALTHY = {"max_tokens": 20, "ignore_eos": True}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def running(tiny_folder) -> Iterator[tuple[str, EngineControl]]:
    with faulty_tiny_server(tiny_folder, MODEL) as (server, control):
        yield server.url, control


def sse_payloads(response: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.iter_lines() if line]


def assert_request_failed(error: dict) -> None:
    assert error["type"] == "internal_error" and error["code"] == "request_failed"
    assert EngineFaults.FAILURE in error["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", {"prompt": ["one", "two"]}), ("/v1/chat/completions", {"messages": HI})],
)
def test_a_failed_request_is_a_500_in_openai_shape(running, path, body):
    url, control = running
    response = httpx.post(url + path, json={**body, **FAILING}, timeout=30)
    assert response.status_code == 500, response.text
    assert_request_failed(response.json()["error"])
    assert httpx.get(f"{url}/health").status_code == 200
    deadline = time.monotonic() + 10
    while not control.is_idle():  # the other prompt of the request was aborted with it
        assert time.monotonic() < deadline, "requests of the failed one are still running"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", {"prompt": "one"}), ("/v1/chat/completions", {"messages": HI})],
)
def test_a_failed_stream_ends_with_an_error_event(running, path, body):
    url, _ = running
    request = {**body, **FAILING, "stream": True}
    with httpx.stream("POST", url + path, json=request, timeout=30) as response:
        assert response.status_code == 200
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    assert_request_failed(json.loads(payloads[-2])["error"])


def test_requests_beside_a_failed_one_are_served(running):
    url, control = running
    results: dict[str, httpx.Response] = {}

    def send(name: str, body: dict) -> None:
        results[name] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)

    control.paced.set()
    try:
        threads = [
            threading.Thread(target=send, args=("failing", {"prompt": "bad", **FAILING})),
            threading.Thread(target=send, args=("healthy", {"prompt": "good", **HEALTHY})),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        control.paced.clear()
    assert results["failing"].status_code == 500
    healthy = results["healthy"]
    assert healthy.status_code == 200, healthy.text
    assert healthy.json()["usage"]["completion_tokens"] == HEALTHY["max_tokens"]
