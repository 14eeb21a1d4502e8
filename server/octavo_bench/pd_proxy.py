"""How ``python -m octavo_bench pd`` sends its requests: spread over co-located servers,
or split between a prefill and a decode server as the llm-d routing sidecar splits them.

- **co-located**: each request goes whole (streamed) to the server with the fewest of
  this run's requests in flight (ties: round-robin).
- **P/D**: first a non-streamed ``max_tokens: 1`` request carrying ``kv_transfer_params:
  {"do_remote_decode": true}`` to the prefill server; the ``kv_transfer_params`` its answer
  carries at the top level go verbatim into the original streamed request to the decode
  server, which pulls the prompt's KV blocks instead of computing them (vLLM's
  NixlConnector contract). With a threshold, prompts shorter than it skip the prefill
  server (llm-d's prefix-based decider); without one every request is split (its
  always-disagg decider). TTFT and latency count from the prefill request's start.

Streaming, timing and errors are ``serve_client``'s: a failure of any kind is a failed
record, never the end of the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from octavo_bench.pd_workload import MixedRequest
from octavo_bench.serve_client import (
    ClientOptions,
    Target,
    error_message,
    make_client,
    request_body,
    send_request,
)
from octavo_bench.serve_metrics import RequestRecord

REMOTE_DECODE = {"do_remote_decode": True}


@dataclass
class Sent:
    """One request of the run: its kind, what the client saw, and (P/D) its prefill part."""

    kind: str
    record: RequestRecord
    split: bool = False  # sent to the prefill server first
    prefill_s: float = 0.0  # the prefill request's round trip


Route = Callable[[httpx.AsyncClient, MixedRequest, float], Awaitable[Sent]]


class LeastLoaded:
    """Co-located servers: each request whole to the server with the fewest in flight."""

    def __init__(self, targets: Sequence[Target], options: ClientOptions) -> None:
        self.targets, self.options = list(targets), options
        self.in_flight = [0] * len(self.targets)
        self.turns = itertools.cycle(range(len(self.targets)))

    def pick(self) -> int:
        fewest = min(self.in_flight)
        return next(i for i in self.turns if self.in_flight[i] == fewest)

    async def __call__(self, client, request: MixedRequest, level_start: float) -> Sent:
        index = self.pick()
        self.in_flight[index] += 1
        try:
            target = self.targets[index]
            record = await send_request(client, target, request.prompt, self.options, level_start)
        finally:
            self.in_flight[index] -= 1
        return Sent(request.kind, record)


@dataclass
class PrefillThenDecode:
    """The routing sidecar's split: prefill on one server, decode on the other."""

    prefill: Target
    decode: Target
    options: ClientOptions
    threshold_words: int = 0  # prompts shorter than this go to the decode server alone

    async def __call__(self, client, request: MixedRequest, level_start: float) -> Sent:
        if request.prompt.input_words < self.threshold_words:
            record = await send_request(
                client, self.decode, request.prompt, self.options, level_start
            )
            return Sent(request.kind, record)
        start = time.perf_counter()
        params, error = await self.remote_prefill(client, request)
        prefill_s = time.perf_counter() - start
        if params is None:
            failed = RequestRecord(start=start - level_start, latency=prefill_s, error=error)
            return Sent(request.kind, failed, True, prefill_s)
        extra = {**self.options.extra_body, "kv_transfer_params": params}
        options = dataclasses.replace(self.options, extra_body=extra)
        record = await send_request(client, self.decode, request.prompt, options, level_start)
        if record.success:
            record.ttft += prefill_s
        record.latency += prefill_s
        record.start = start - level_start
        return Sent(request.kind, record, True, prefill_s)

    async def remote_prefill(self, client, request: MixedRequest) -> tuple[Any, str]:
        """The prefill server's ``kv_transfer_params`` (None and why when it failed)."""
        body = request_body(self.prefill, request.prompt, self.options)
        body.pop("stream_options", None)
        body |= {"stream": False, "max_tokens": 1, "kv_transfer_params": REMOTE_DECODE}
        try:
            response = await client.post(self.prefill.url, json=body)
        except httpx.HTTPError as error:
            return None, f"prefill: {type(error).__name__}: {error}"
        if response.status_code != 200:
            return None, "prefill: " + error_message(response.status_code, response.text)
        params = response.json().get("kv_transfer_params")
        if not isinstance(params, dict):
            return None, "prefill: the answer carried no kv_transfer_params"
        return params, ""


async def run_mixed(
    requests: Sequence[MixedRequest], route: Route, options: ClientOptions
) -> tuple[list[Sent], float]:
    """Send every request at its arrival time (open loop: no cap on those in flight);
    the results in request order and the run's wall seconds."""
    async with make_client(max(1, len(requests)), options, None) as client:
        level_start = time.perf_counter()

        async def one(request: MixedRequest) -> Sent:
            await asyncio.sleep(max(0.0, level_start + request.at_s - time.perf_counter()))
            return await route(client, request, level_start)

        sent = await asyncio.gather(*(one(request) for request in requests))
        return list(sent), time.perf_counter() - level_start
