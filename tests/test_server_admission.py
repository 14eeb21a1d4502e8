"""Fan-out of one request: capped at --max-sequences-per-request, admitted in one batch (all
or none), and aborted all at once when the client leaves (issue: a 3,000-prompt request
kept 31 requests running 30 s after its client had gone)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from octavo.entrypoints.openai.app import context_of

from conftest import EngineFaults, faulty_tiny_server
from server_harness import (
    EngineControl,
    ThreadedServer,
    metric_value,
)

MODEL = "tiny"
MAX_MODEL_LEN = 256
MAX_NUM_SEQS = 16
NUM_PROMPTS = 40
LEFT_WITHIN_SECONDS = 1.5  # the disconnect poll (0.1 s) + one abort + a paced step or two
LONG = {"max_tokens": 200, "ignore_eos": True}


@dataclass
class Running:
    server: ThreadedServer
    control: EngineControl

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def running(tiny_folder) -> Iterator[Running]:
    engine_kwargs = {"max_model_len": MAX_MODEL_LEN, "max_num_seqs": MAX_NUM_SEQS}
    with faulty_tiny_server(tiny_folder, MODEL, **engine_kwargs) as (server, control):
        yield Running(server, control)


def kv_cap(running: Running) -> int:
    """The default cap: sequences of max_model_len tokens that the KV cache holds."""
    engine = running.control.engine
    kv_tokens = engine.stats().num_blocks * engine.kv.block_size
    return max(MAX_NUM_SEQS, kv_tokens // MAX_MODEL_LEN)


def engine_counts(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    running = metric_value(text, "vllm:num_requests_running")
    return running, metric_value(text, "vllm:num_requests_waiting")


def seconds_until_idle(url: str, limit: float = 20.0) -> float:
    started = time.monotonic()
    while engine_counts(url) != (0, 0):
        assert time.monotonic() - started < limit, "the engine never went idle"
        time.sleep(0.02)
    return time.monotonic() - started


def wait_busy(url: str, expected: int) -> None:
    deadline = time.monotonic() + 30
    while sum(engine_counts(url)) < expected:
        assert time.monotonic() < deadline, f"never saw {expected} requests in the engine"
        time.sleep(0.02)


def prompts(count: int) -> list[str]:
    return [f"Prompt number {index} goes on" for index in range(count)]


# ----- the cap -----------------------------------------------------------------------------
def test_three_thousand_prompts_are_refused_before_reaching_the_engine(running):
    cap = kv_cap(running)
    assert cap == context_of(running.server.app).engine.info.default_max_sequences_per_request
    body = {"prompt": prompts(3000), "max_tokens": 5}
    response = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "3000 sequences" in error["message"] and f"limit is {cap}" in error["message"]
    assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
    assert engine_counts(running.url) == (0, 0)


def test_prompts_times_n_count_against_the_cap(running):
    cap = kv_cap(running)
    body = {"prompt": prompts(cap // 2 + 1), "n": 2, "max_tokens": 1}
    response = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400 and "limit is" in response.json()["error"]["message"]
    config = context_of(running.server.app).config
    config.max_sequences_per_request = 4  # what --max-sequences-per-request 4 sets
    try:
        ok = {"prompt": prompts(2), "n": 2, "max_tokens": 1}
        assert httpx.post(f"{running.url}/v1/completions", json=ok, timeout=60).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "n": 5, "max_tokens": 1}
        refused = httpx.post(f"{running.url}/v1/chat/completions", json=chat, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
    finally:
        config.max_sequences_per_request = None


# ----- all at once -------------------------------------------------------------------------
def test_a_refused_prompt_leaves_none_of_its_request_in_the_engine(running):
    body = {"prompt": prompts(4), "seed": EngineFaults.REFUSE_SEED, **LONG}
    response = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert EngineFaults.MESSAGE in response.json()["error"]["message"]
    assert seconds_until_idle(running.url) < LEFT_WITHIN_SECONDS
    assert running.control.is_idle(), "the prompts added before the refusal are still there"


def test_an_unexpected_error_while_adding_is_a_500_and_the_engine_goes_on(running):
    body = {"prompt": prompts(4), "seed": EngineFaults.CRASH_SEED, "max_tokens": 2}
    response = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 500, response.text
    assert response.json()["error"]["type"] == "internal_error"
    assert seconds_until_idle(running.url) < LEFT_WITHIN_SECONDS
    assert httpx.get(f"{running.url}/health").status_code == 200
    after = {"prompt": prompts(4), "max_tokens": 2, "ignore_eos": True}
    ok = httpx.post(f"{running.url}/v1/completions", json=after, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8


def test_a_client_leaving_a_many_prompt_request_aborts_them_all_at_once(running):
    aborted_before = aborts(running.url)
    running.control.paced.set()
    try:
        body = {"prompt": prompts(NUM_PROMPTS), **LONG}
        impatient = httpx.Timeout(30, read=1.5)
        with httpx.Client(timeout=impatient) as client, pytest.raises(httpx.ReadTimeout):
            client.post(f"{running.url}/v1/completions", json=body)
        left_after = seconds_until_idle(running.url)
    finally:
        running.control.paced.clear()
    assert left_after < LEFT_WITHIN_SECONDS, f"requests ran {left_after:.2f} s after the client"
    assert aborts(running.url) - aborted_before == NUM_PROMPTS
    assert running.control.is_idle()


def test_a_client_leaving_a_many_prompt_stream_aborts_them_all_at_once(running):
    running.control.paced.set()
    try:
        body = {"prompt": prompts(NUM_PROMPTS), "stream": True, **LONG}
        url = f"{running.url}/v1/completions"
        with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body) as response:
            assert response.status_code == 200
            wait_busy(running.url, NUM_PROMPTS)
            next(response.iter_lines())
        left_after = seconds_until_idle(running.url)
    finally:
        running.control.paced.clear()
    assert left_after < LEFT_WITHIN_SECONDS, f"requests ran {left_after:.2f} s after the client"
    assert running.control.is_idle()


def aborts(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    try:
        return metric_value(text, "vllm:request_success_total", finished_reason="abort")
    except KeyError:
        return 0.0
