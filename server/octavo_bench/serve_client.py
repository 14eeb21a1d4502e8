"""The streaming HTTP client of ``python -m octavo_bench serve`` (httpx, asyncio, SSE parsing).

Every request streams (``stream: true`` with ``stream_options.include_usage``), is greedy
(``temperature: 0``) and, by default, sends ``ignore_eos: true`` so each request yields
exactly ``max_tokens`` tokens on servers that honour it (Octavo, vLLM, llama.cpp).
Errors of any kind (HTTP status, an error event in the stream, a dropped connection)
become a failed ``RequestRecord`` carrying the message; they never end the run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm import tqdm

from octavo_bench.serve_metrics import RequestRecord
from octavo_bench.serve_workload import PromptSpec

ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
ERROR_TEXT_LIMIT = 500


@dataclass(frozen=True)
class Target:
    """A server to measure: where it is, which model and endpoint to use."""

    base_url: str
    model: str
    endpoint: str = "chat"
    api_key: str | None = None

    @property
    def url(self) -> str:
        return normalize_base_url(self.base_url) + ENDPOINT_PATHS[self.endpoint]


@dataclass(frozen=True)
class ClientOptions:
    ignore_eos: bool = True
    timeout_s: float = 600.0
    show_progress: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request


@dataclass
class _Stream:
    """What has been read of one response stream so far."""

    start: float
    last: float | None = None
    ttft: float = 0.0
    itls: list[float] = field(default_factory=list)
    chunks: int = 0
    usage: dict[str, Any] | None = None
    error: str = ""


def normalize_base_url(base_url: str) -> str:
    """``http://host:8000``, ``http://host:8000/`` and ``http://host:8000/v1`` all work."""
    return base_url.rstrip("/").removesuffix("/v1")


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def request_body(target: Target, prompt: PromptSpec, options: ClientOptions) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": prompt.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if options.ignore_eos:
        body["ignore_eos"] = True
    if target.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return {**body, **options.extra_body}


def error_message(status: int, text: str) -> str:
    """``HTTP 404: <message>`` from an OpenAI error body, FastAPI's detail, or raw text."""
    message = text.strip()[:ERROR_TEXT_LIMIT]
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail"))
        if isinstance(error, dict):
            message = str(error.get("message", error))
        elif error is not None:
            message = str(error)
    return f"HTTP {status}: {message}"


def chunk_content(chunk: dict[str, Any], endpoint: str) -> str:
    """The generated text one streamed chunk carries ('' for role/usage/finish chunks)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if endpoint == "chat":
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def read_event(state: _Stream, data: str, endpoint: str) -> bool:
    """Take one SSE ``data:`` payload into ``state``; False once the stream is over."""
    if data == "[DONE]":
        return False
    chunk = json.loads(data)
    if "error" in chunk:
        error = chunk["error"]
        state.error = str(error.get("message", error) if isinstance(error, dict) else error)
        return False
    if chunk.get("usage"):
        state.usage = chunk["usage"]
    if chunk_content(chunk, endpoint):
        now = time.perf_counter()
        if state.last is None:
            state.ttft = now - state.start
        else:
            state.itls.append(now - state.last)
        state.last = now
        state.chunks += 1
    return True


async def read_stream(response: httpx.Response, state: _Stream, endpoint: str) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, other SSE fields
        if not read_event(state, line.removeprefix("data:").strip(), endpoint):
            return


def finish_record(state: _Stream, prompt: PromptSpec, level_start: float) -> RequestRecord:
    record = RequestRecord(
        start=state.start - level_start, latency=time.perf_counter() - state.start
    )
    if state.error:
        record.error = state.error
        return record
    if state.chunks == 0:
        record.error = "the stream carried no generated text"
        return record
    usage = state.usage or {}
    record.usage_reported = "completion_tokens" in usage
    record.output_len = int(usage.get("completion_tokens", state.chunks))
    record.prompt_len = int(usage.get("prompt_tokens", prompt.input_words))
    record.success, record.ttft, record.itls = True, state.ttft, state.itls
    return record


async def send_request(
    client: httpx.AsyncClient,
    target: Target,
    prompt: PromptSpec,
    options: ClientOptions,
    level_start: float,
) -> RequestRecord:
    """Stream one request and time it; any failure is returned as a failed record."""
    state = _Stream(start=time.perf_counter())
    body = request_body(target, prompt, options)
    try:
        async with client.stream("POST", target.url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                state.error = error_message(response.status_code, text)
            else:
                await read_stream(response, state, target.endpoint)
    except (httpx.HTTPError, ValueError) as error:  # ValueError: a malformed JSON event
        state.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return finish_record(state, prompt, level_start)


def make_client(concurrency: int, options: ClientOptions, api_key: str | None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(options.timeout_s, connect=30.0)
    # trust_env=False: never route benchmark traffic through an environment proxy.
    return httpx.AsyncClient(
        limits=limits, timeout=timeout, headers=headers(api_key), trust_env=False
    )


async def run_level(
    target: Target,
    prompts: Sequence[PromptSpec],
    concurrency: int,
    arrivals: Sequence[float],
    options: ClientOptions,
    label: str = "",
) -> tuple[list[RequestRecord], float]:
    """Send ``prompts`` at their arrival times, at most ``concurrency`` in flight.

    Returns the records (in prompt order) and the level's duration in seconds.
    """
    gate = asyncio.Semaphore(concurrency)
    progress = tqdm(
        total=len(prompts), desc=label or None, unit="req", disable=not options.show_progress
    )
    async with make_client(concurrency, options, target.api_key) as client:
        level_start = time.perf_counter()

        async def one(prompt: PromptSpec, at: float) -> RequestRecord:
            await asyncio.sleep(max(0.0, level_start + at - time.perf_counter()))
            async with gate:
                record = await send_request(client, target, prompt, options, level_start)
            progress.update(1)
            return record

        records = await asyncio.gather(*(one(p, t) for p, t in zip(prompts, arrivals, strict=True)))
        duration = time.perf_counter() - level_start
    progress.close()
    return list(records), duration


async def fetch_models(
    base_url: str, api_key: str | None, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """The model cards ``GET /v1/models`` lists (id, and max_model_len on Octavo and vLLM)."""
    url = normalize_base_url(base_url) + "/v1/models"
    try:
        async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
            response = await client.get(url, headers=headers(api_key))
    except httpx.HTTPError as error:
        raise ValueError(f"cannot reach {url}: {type(error).__name__}: {error}") from None
    if response.status_code != 200:
        raise ValueError(f"{url}: {error_message(response.status_code, response.text)}")
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{url} lists no models; pass --model")
    return models


async def fetch_model_id(base_url: str, api_key: str | None, timeout_s: float = 30.0) -> str:
    """The first model id that ``GET /v1/models`` lists."""
    models = await fetch_models(base_url, api_key, timeout_s)
    return str(models[0]["id"])
