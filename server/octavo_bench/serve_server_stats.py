"""What the server itself reports during a level of ``python -m octavo_bench serve``.

While a level runs, ``/metrics`` (Prometheus text, vLLM's metric names, which Octavo and
vLLM both serve) is read every ``interval_s``: the peaks of ``vllm:num_requests_running``
(the largest batch the server ran) and ``vllm:kv_cache_usage_perc`` (its KV cache in use,
0-1; vLLM's older ``vllm:gpu_cache_usage_perc`` is read where the new one is missing). A
server without ``/metrics`` (the naive HF server) leaves them None.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from octavo_bench.serve_client import headers, normalize_base_url

RUNNING = "vllm:num_requests_running"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass
class ServerPeaks:
    """The largest values seen during a level (None: the server never reported them)."""

    max_running: int | None = None
    max_kv_cache_usage: float | None = None
    samples: int = 0

    def add(self, text: str) -> None:
        values = metric_values(text)
        running = values.get(RUNNING)
        if running is not None:
            self.max_running = max(self.max_running or 0, round(running))
        usage = next((values[name] for name in KV_USAGE if name in values), None)
        if usage is not None:
            self.max_kv_cache_usage = max(self.max_kv_cache_usage or 0.0, usage)
        self.samples += 1


def metric_values(text: str) -> dict[str, float]:
    """Each metric's value summed over its label sets (one engine's series per name)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            values[name] = values.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return values


async def _poll(base_url: str, api_key: str | None, peaks: ServerPeaks, interval_s: float):
    url = normalize_base_url(base_url) + "/metrics"
    async with httpx.AsyncClient(timeout=5.0, headers=headers(api_key)) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                response = await client.get(url)
                if response.status_code == 200:
                    peaks.add(response.text)
            await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def watching(
    base_url: str, api_key: str | None, interval_s: float = 0.25
) -> AsyncIterator[ServerPeaks]:
    """Peaks of the server's own figures while the block runs."""
    peaks = ServerPeaks()
    task = asyncio.create_task(_poll(base_url, api_key, peaks, interval_s))
    try:
        yield peaks
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
