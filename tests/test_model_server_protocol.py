"""The model-server protocol an endpoint picker scrapes (the Gateway API Inference
Extension's proposal 003, as the llm-d router v0.10.0 parses it), from real servers.

Every series the picker reads is checked with its labels, parsed from ``/metrics`` with
prometheus_client's text parser: the queue and running gauges, the KV cache usage (a
0-1 fraction), ``vllm:cache_config_info`` (block size and block count equal the
engine's), and with LoRA on ``vllm:lora_requests_info`` read the router's way (the
series with the newest timestamp; adapters comma-separated) with an adapter running
and another waiting for a slot. ``/v1/models`` lists adapters with their base as
``parent``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from octavo.entrypoints.openai.context import ServerConfig
from octavo.lora_request import LoRAModulePath

from conftest import tiny_server
from lora_adapters import make_adapter
from server_harness import EngineControl, ThreadedServer, build_local_app, torch_threads

MODEL = "tiny"
BLOCK_SIZE = 8  # not the default 16: the metric must say what the engine really uses
PROMPT = [(j * 7) % 500 + 3 for j in range(20)]
SLOW = {"max_tokens": 60, "ignore_eos": True, "temperature": 0}
WAIT_SECONDS = 30


def scrape(url: str) -> dict[str, list[Sample]]:
    """Each metric family's samples, parsed by prometheus_client's text parser."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def only_sample(families: dict[str, list[Sample]], name: str) -> Sample:
    (sample,) = families[name]
    return sample


@dataclass(frozen=True)
class LoraView:
    """What the router keeps of ``vllm:lora_requests_info``: the newest series' labels."""

    max_lora: int
    running: set[str]
    waiting: set[str]
    updated: float


def router_lora_view(families: dict[str, list[Sample]]) -> LoraView:
    """The llm-d router's reading: newest value wins; names split on ',' and trimmed."""
    newest = max(families["vllm:lora_requests_info"], key=lambda sample: sample.value)

    def names(label: str) -> set[str]:
        return {name.strip() for name in newest.labels[label].split(",") if name.strip()}

    return LoraView(
        max_lora=int(newest.labels["max_lora"]),
        running=names("running_lora_adapters"),
        waiting=names("waiting_lora_adapters"),
        updated=newest.value,
    )


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def paced_server(tiny_folder) -> Iterator[tuple[str, EngineControl]]:
    """One sequence at a time (a second request waits), steps slowed on demand."""
    control = EngineControl()
    with tiny_server(
        tiny_folder, MODEL, control.attach, max_num_seqs=1, block_size=BLOCK_SIZE
    ) as server:
        yield server.url, control


def complete(url: str, model: str = MODEL) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, **SLOW}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def test_queue_running_and_kv_usage_follow_the_engine(paced_server):
    url, control = paced_server
    idle = scrape(url)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert only_sample(idle, name).labels == {"model_name": MODEL}
        assert only_sample(idle, name).value == 0
    control.paced.set()
    try:
        with ThreadPoolExecutor(2) as pool:
            replies = [pool.submit(complete, url) for _ in range(2)]
            wait_for(lambda: _running_and_waiting(url) == (1, 1), "one running, one waiting")
            busy = scrape(url)
            control.paced.clear()
            assert all(reply.result().status_code == 200 for reply in replies)
    finally:
        control.paced.clear()
    usage = only_sample(busy, "vllm:kv_cache_usage_perc")
    assert usage.labels == {"model_name": MODEL}
    # 20 prompt tokens and some generated in blocks of 8 of a cache of hundreds of blocks:
    # a fraction of the cache, well under 1 (a percentage would read above 1).
    assert 0 < usage.value < 0.5
    wait_for(control.is_idle, "the engine to go idle")
    assert only_sample(scrape(url), "vllm:kv_cache_usage_perc").value == 0


def _running_and_waiting(url: str) -> tuple[float, float]:
    families = scrape(url)
    running = only_sample(families, "vllm:num_requests_running").value
    return running, only_sample(families, "vllm:num_requests_waiting").value


def test_cache_config_info_is_the_engines_block_size_and_count(paced_server):
    url, control = paced_server
    sample = only_sample(scrape(url), "vllm:cache_config_info")
    engine = control.engine
    assert sample.value == 1
    assert sample.labels["block_size"] == str(engine.kv.block_size) == str(BLOCK_SIZE)
    assert sample.labels["num_gpu_blocks"] == str(len(engine.parts.pool.blocks))
    assert sample.labels == {
        "block_size": str(BLOCK_SIZE),
        "num_gpu_blocks": str(engine.stats().num_blocks),
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.9",
        "kv_cache_memory_bytes": str(8 << 20),
        "num_cpu_blocks": "None",
        "engine": "0",
    }


def test_no_lora_info_without_lora(paced_server):
    url, _ = paced_server
    assert "vllm:lora_requests_info" not in scrape(url)  # as vLLM: only with LoRA on


@pytest.fixture(scope="module")
def lora_server(tiny_folder, tmp_path_factory) -> Iterator[tuple[str, EngineControl, dict]]:
    """LoRA on with one adapter slot (``--max-loras 1``) and two adapters, so a request
    for the second waits while one for the first runs."""
    base, root = tiny_folder("llama3"), tmp_path_factory.mktemp("protocol-adapters")
    names = ["alpha", "beta"]
    paths = {
        name: str(make_adapter(base, root / name, seed=i, rank=4)) for i, name in enumerate(names)
    }
    control = EngineControl()
    config = ServerConfig(served_model_names=[MODEL, "also-tiny"], model_root="tiny-root")
    app = build_local_app(
        str(base),
        config,
        control.attach,
        dtype="float32",
        max_model_len=256,
        kv_cache_memory=8 << 20,
        max_loras=1,
        max_lora_rank=8,
        lora_modules=[LoRAModulePath(name, path) for name, path in paths.items()],
    )
    with torch_threads(1), ThreadedServer(app) as server:
        yield server.wait_ready().url, control, paths


def test_lora_info_before_any_request_names_no_adapter(lora_server):
    url, _, _ = lora_server
    sample = only_sample(scrape(url), "vllm:lora_requests_info")
    assert sample.labels == {
        "max_lora": "1",
        "waiting_lora_adapters": "",
        "running_lora_adapters": "",
    }
    assert 0 < time.time() - sample.value < 3600, "the value is a Unix time in seconds"


def test_lora_info_shows_the_running_and_the_waiting_adapter(lora_server):
    url, control, _ = lora_server
    control.paced.set()
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(complete, url, "alpha")
            wait_for(lambda: router_lora_view(scrape(url)).running == {"alpha"}, "alpha runs")
            second = pool.submit(complete, url, "beta")
            wait_for(lambda: router_lora_view(scrape(url)).waiting == {"beta"}, "beta waits")
            busy = router_lora_view(scrape(url))
            control.paced.clear()
            _all_ok([first, second])
    finally:
        control.paced.clear()
    assert busy == LoraView(1, {"alpha"}, {"beta"}, busy.updated)
    wait_for(control.is_idle, "the engine to go idle")
    done = router_lora_view(scrape(url))
    assert (done.running, done.waiting) == (set(), set())
    assert done.updated > busy.updated, "the newest series is the router's"


def _all_ok(replies: list[Future]) -> None:
    for reply in replies:
        assert reply.result().status_code == 200, reply.result().text


def test_models_list_adapters_under_the_base_model(lora_server):
    url, _, paths = lora_server
    cards = {card["id"]: card for card in httpx.get(f"{url}/v1/models").json()["data"]}
    assert set(cards) == {MODEL, "also-tiny", "alpha", "beta"}
    for name in (MODEL, "also-tiny"):
        assert (cards[name]["root"], cards[name]["parent"]) == ("tiny-root", None)
    for name, path in paths.items():
        assert cards[name]["parent"] == MODEL, "vLLM: the first served name is the parent"
        assert cards[name]["root"] == path
        assert cards[name]["object"] == "model"
