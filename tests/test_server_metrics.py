"""Metrics move with traffic, by exactly what was served; a real Prometheus scrapes them.

Every request in this module goes through ``Ledger``, which adds up the ``usage`` the
server reported, so the counters can be checked for equality, not just growth.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from conftest import running_tiny_server
from prometheus_runner import (
    Prometheus,
    ScrapeJob,
    running_prometheus,
)
from server_harness import metric_value

MODEL = "tiny"
LONG = {"ignore_eos": True, "temperature": 0}
MESSAGES = [{"role": "user", "content": "Count the stars."}]
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
)


@dataclass
class Ledger:
    """The server plus the running total of what it served, from the responses' usage."""

    url: str
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: Counter[str] = field(default_factory=Counter)  # engine requests by reason

    def scrape(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send a request; return the response body (or for streams the usage chunk)."""
        body = {"model": MODEL, **body}
        if body.get("stream"):
            body["stream_options"] = {"include_usage": True}
        response = httpx.post(f"{self.url}{path}", json=body, timeout=60)
        assert response.status_code == 200, response.text
        if body.get("stream"):
            return self._record_stream(response.text, body)
        result = response.json()
        self._record(result["usage"], [c["finish_reason"] for c in result["choices"]], body)
        return result

    def _record_stream(self, text: str, body: dict[str, Any]) -> dict[str, Any]:
        events = [block.removeprefix("data: ") for block in text.split("\n\n") if block]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in events[:-1]]
        reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"]]
        self._record(chunks[-1]["usage"], [reason for reason in reasons if reason], body)
        return chunks[-1]

    def _record(self, usage: dict[str, int], reasons: list[str], body: dict[str, Any]) -> None:
        self.prompt_tokens += usage["prompt_tokens"]
        self.generation_tokens += usage["completion_tokens"]
        n = body.get("n", 1)  # the engine counts requests: one per prompt, with n choices
        for first in range(0, len(reasons), n):
            self.finished[reasons[first]] += 1


@pytest.fixture(scope="module")
def ledger(tiny_folder) -> Iterator[Ledger]:
    with running_tiny_server(tiny_folder, MODEL) as url:
        yield Ledger(url)


def snapshot(text: str) -> dict[str, float]:
    """The values this module checks, from one scrape."""
    values = {
        name: metric_value(text, name)
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    }
    for reason in ("length", "stop", "abort"):
        name = "vllm:request_success_total"
        try:
            values[reason] = metric_value(text, name, finished_reason=reason)
        except KeyError:
            values[reason] = 0.0
    for histogram in HISTOGRAMS:
        values[f"{histogram}_count"] = metric_value(text, f"{histogram}_count")
    for histogram in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        values[f"{histogram}_sum"] = metric_value(text, f"{histogram}_sum")
    values["itl"] = metric_value(text, "vllm:inter_token_latency_seconds_count")
    return values


def serve_traffic(ledger: Ledger) -> None:
    """Completions and chat, streamed and not, n=1 and 2, ending by length and by stop."""
    ledger.post("/v1/completions", {"prompt": ["One", "Two words"], "max_tokens": 4, **LONG})
    ledger.post("/v1/completions", {"prompt": "Three", "max_tokens": 5, "n": 2, **LONG})
    ledger.post("/v1/completions", {"prompt": "Four", "max_tokens": 6, "stream": True, **LONG})
    ledger.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3, **LONG})
    ledger.post(
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 4, "n": 2, "stream": True, **LONG},
    )
    text = ledger.post("/v1/completions", {"prompt": "Five", "max_tokens": 12, **LONG})
    stop = stop_string(text["choices"][0]["text"])
    stopped = ledger.post(
        "/v1/completions", {"prompt": "Five", "max_tokens": 12, "stop": [stop], **LONG}
    )
    assert stopped["choices"][0]["finish_reason"] == "stop"


def stop_string(text: str) -> str:
    for start in range(1, len(text) - 3):
        piece = text[start : start + 3]
        if text.find(piece) == start and piece.strip():
            return piece
    pytest.fail(f"no usable stop string in {text!r}")


def test_counters_move_by_exactly_what_was_served(ledger):
    before = snapshot(ledger.scrape())
    prompt_before, generated_before = ledger.prompt_tokens, ledger.generation_tokens
    finished_before = Counter(ledger.finished)
    serve_traffic(ledger)
    refused = httpx.post(f"{ledger.url}/v1/completions", json={"prompt": "x", "n": 0})
    assert refused.status_code == 400  # refused requests count nowhere
    after = snapshot(ledger.scrape())

    def grew(name: str) -> float:
        return after[name] - before[name]

    served_prompt = ledger.prompt_tokens - prompt_before
    served_generated = ledger.generation_tokens - generated_before
    finished = ledger.finished - finished_before
    requests = sum(finished.values())
    assert (requests, finished["stop"]) == (8, 1)
    assert grew("vllm:prompt_tokens_total") == served_prompt
    assert grew("vllm:generation_tokens_total") == served_generated
    assert grew("length") == finished["length"] and grew("stop") == finished["stop"]
    assert grew("abort") == 0
    for histogram in HISTOGRAMS:
        assert grew(f"{histogram}_count") == requests, histogram
    assert grew("vllm:request_prompt_tokens_sum") == served_prompt
    assert grew("vllm:request_generation_tokens_sum") == served_generated
    assert 0 < grew("itl") <= served_generated - requests  # one per step after the first
    final = ledger.scrape()
    assert metric_value(final, "vllm:num_requests_running") == 0
    assert metric_value(final, "vllm:kv_cache_usage_perc") == 0


# ----- a real Prometheus ---------------------------------------------------------------------
@pytest.fixture
def prometheus(ledger, prometheus_binary, tmp_path) -> Iterator[Prometheus]:
    job = ScrapeJob("octavo", (ledger.url.removeprefix("http://"),))
    with running_prometheus(prometheus_binary, [job], tmp_path) as server:
        yield server


def test_real_prometheus_scrapes_the_served_count(ledger, prometheus):
    ledger.post("/v1/completions", {"prompt": "Scraped", "max_tokens": 7, **LONG})
    ledger.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5, **LONG})
    selector = f'{{job="octavo", model_name="{MODEL}"}}'
    assert prometheus.wait_for('up{job="octavo"}', 1.0) == 1.0, "target never up"
    generated = prometheus.wait_for(
        f"sum(vllm:generation_tokens_total{selector})", ledger.generation_tokens
    )
    assert generated == ledger.generation_tokens
    prompt = prometheus.wait_for(f"sum(vllm:prompt_tokens_total{selector})", ledger.prompt_tokens)
    assert prompt == ledger.prompt_tokens
