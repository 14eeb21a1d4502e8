"""Running an app on a real uvicorn server in a background thread (tests only).

The server listens on a free loopback port; signals are left alone (uvicorn only
installs handlers on the main thread).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import uvicorn
from fastapi import FastAPI

from octavo.config import EngineArgs
from octavo.entrypoints.openai.app import build_app, context_of
from octavo.entrypoints.openai.context import ServerConfig
from octavo.entrypoints.openai.uvicorn_config import uvicorn_config
from octavo_bench.serve_launch import LOOPBACK


def build_local_app(
    model: str,
    config: ServerConfig | None = None,
    on_engine: Callable[[Any], None] | None = None,
    **engine_kwargs: Any,
) -> FastAPI:
    """An app serving the model folder ``model`` with ``EngineArgs(**engine_kwargs)``.

    ``on_engine`` is called on the engine thread with the freshly built ``LLMEngine``
    (tests use it to reach the engine's internals or to wrap its methods).
    """
    from octavo.engine.core_thread import ThreadCore
    from octavo.engine.llm_engine import LLMEngine

    def factory() -> LLMEngine:
        engine = LLMEngine(EngineArgs(model=model, **engine_kwargs))
        if on_engine is not None:
            on_engine(engine)
        return engine

    config = config or ServerConfig(served_model_names=[model], model_root=model)
    return build_app(config, ThreadCore(factory))


class ThreadedServer:
    """``with ThreadedServer(app) as server: httpx.get(server.url + "/health")``."""

    # A guard, not a budget: a served SmolLM2 loads and captures its CPU decode graphs in a
    # few seconds, but a CI machine running both suites at once (2 cores) has taken over 30.
    def __init__(self, app: FastAPI, startup_timeout: float = 120.0) -> None:
        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((LOOPBACK, 0))
        self.port = self._socket.getsockname()[1]
        config = context_of(app).config
        settings = uvicorn_config(app, config, log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(settings)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        self._startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        self._wait(lambda: self.server.started, "the server did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()

    def wait_ready(self) -> ThreadedServer:
        """Block until the engine has loaded (or raise if it failed)."""
        engine = context_of(self.app).engine
        self._wait(lambda: engine.is_ready or engine.status == "failed", "engine not ready")
        if not engine.is_ready:
            raise RuntimeError(f"the engine did not load ({engine.status})")
        return self

    def _wait(self, condition: Callable[[], bool], message: str) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{message} after {self._startup_timeout:.0f} s")
            time.sleep(0.02)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run torch with ``count`` intra-op threads, then restore the previous number.

    Tests wrap tiny-model servers in ``torch_threads(1)``: such models gain nothing from
    more threads, and on a busy shared CPU, spinning OpenMP threads make each step many
    times slower.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class EngineControl:
    """Test hooks for ``build_local_app(..., on_engine=control.attach)``.

    ``loaded`` gates the end of loading (cleared: /health stays 503 "loading"); while
    ``paced`` is set every engine step first sleeps ``pace_seconds``, so a request stays
    running long enough to observe (the tiny test models otherwise finish in a blink);
    while ``steps_open`` is cleared every step waits (at most a minute) until it is set
    again, so the requests in the engine stay where they are however slow the machine is.
    """

    def __init__(self, loaded: bool = True, pace_seconds: float = 0.05) -> None:
        self.loaded = threading.Event()
        self.paced = threading.Event()
        self.pace_seconds = pace_seconds
        self.steps_open = threading.Event()
        self.steps_open.set()
        self.engine: Any = None
        if loaded:
            self.loaded.set()

    def attach(self, engine: Any) -> None:
        """Runs on the engine thread once the engine is built."""
        self.engine = engine
        step = engine.step

        def paced_step() -> Any:
            if self.paced.is_set():
                time.sleep(self.pace_seconds)
            if not self.steps_open.wait(timeout=60):
                raise RuntimeError("the test held the engine's steps for a minute")
            return step()

        engine.step = paced_step
        if not self.loaded.wait(timeout=120):
            raise TimeoutError("EngineControl: loading was never released")

    def is_idle(self) -> bool:
        """No request left in the engine and every KV block back in the pool.

        Read from another thread: good enough for polling in tests.
        """
        pool = self.engine.parts.pool
        return not self.engine.requests and pool.num_free_blocks == pool.num_usable_blocks


def metric_samples(text: str, name: str, **labels: str) -> list[float]:
    """The values of the samples called ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]


def engine_stats(prompt_tokens: int, generation_tokens: int, running: int) -> Any:
    """An engine's ``EngineStats`` after it took ``prompt_tokens`` and generated
    ``generation_tokens`` (every prompt token looked up in the prefix cache, none hit)."""
    from octavo.engine.stats import EngineStats

    return EngineStats(
        num_running=running,
        num_waiting=0,
        kv_cache_usage=0.25,
        kv_cache_tokens_held=0,
        kv_cache_slots_allocated=0,
        num_blocks=64,
        prefix_cache_queries=prompt_tokens,
        prefix_cache_hits=0,
        num_preemptions=0,
        prompt_tokens=prompt_tokens,
        generation_tokens=generation_tokens,
    )


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the matching samples of a Prometheus text scrape (``KeyError`` if none)."""
    values = metric_samples(text, name, **labels)
    if not values:
        raise KeyError(f"no sample {name} {labels or ''} in the scrape")
    return sum(values)


@contextmanager
def served_model(
    folder: str,
    config: Any,
    threads: int,
    startup_timeout: float = 120.0,
    **engine_kwargs: Any,
) -> Iterator[ThreadedServer]:
    """``folder`` served on loopback with ``config`` (a ``ServerConfig``), once loaded (within
    ``startup_timeout`` seconds)."""
    app = build_local_app(folder, config, **engine_kwargs)
    with torch_threads(threads), ThreadedServer(app, startup_timeout) as running:
        yield running.wait_ready()


def openai_client(server: ThreadedServer) -> Any:
    """The real openai client pointed at ``server``, without retries."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
