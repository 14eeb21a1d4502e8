"""Server lifecycle: loading, API key, queue limit, disconnects, engine death, draining."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from octavo.entrypoints.openai.app import context_of
from octavo.entrypoints.openai.context import ServerConfig
from octavo.entrypoints.openai.shutdown import drain

from server_harness import EngineControl, ThreadedServer, build_local_app

ENGINE = {"max_model_len": 256, "kv_cache_memory": 4 << 20}
LONG = {"ignore_eos": True, "temperature": 0}


def wait_for(condition, timeout: float = 20.0, message: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def model(tiny_folder) -> str:
    return str(tiny_folder("llama3"))


def config(**kwargs) -> ServerConfig:
    return ServerConfig(served_model_names=["tiny"], model_root="tiny", **kwargs)


def all_blocks_free(engine) -> bool:
    pool = engine.parts.pool
    return pool.num_free_blocks == pool.num_usable_blocks and not engine.requests


# ----- loading -----------------------------------------------------------------------------
def test_health_is_503_while_loading_then_200(model):
    gate = threading.Event()
    app = build_local_app(model, config(), on_engine=lambda _: gate.wait(30), **ENGINE)
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        loading = client.get("/health")
        assert loading.status_code == 503
        assert loading.json()["error"]["code"] == "loading"
        refused = client.post("/v1/completions", json={"prompt": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "loading"
        assert client.get("/v1/models").status_code == 200  # answers without the engine
        assert client.post("/tokenize", json={"prompt": "x"}).status_code == 503
        gate.set()
        server.wait_ready()
        assert client.get("/health").status_code == 200


# ----- API key -----------------------------------------------------------------------------
def test_api_key_guards_everything_but_the_probes(model):
    app = build_local_app(model, config(api_key="sekret"), **ENGINE)
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        server.wait_ready()
        missing = client.get("/v1/models")
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        good = {"Authorization": "Bearer sekret"}
        assert client.get("/v1/models", headers=good).status_code == 200
        body = {"prompt": "x", "max_tokens": 1}
        assert client.post("/v1/completions", json=body, headers=good).status_code == 200
        guarded = [
            ("POST", "/tokenize", {"prompt": "x"}),
            ("POST", "/detokenize", {"tokens": [1, 2]}),
            ("GET", "/docs", None),
            ("GET", "/redoc", None),
            ("GET", "/openapi.json", None),
        ]
        for method, path, payload in guarded:
            refused = client.request(method, path, json=payload)
            assert refused.status_code == 401, path
            assert refused.json()["error"]["code"] == "invalid_api_key", path
            assert client.request(method, path, json=payload, headers=good).status_code == 200
        for path in ("/health", "/metrics", "/version"):
            assert client.get(path).status_code == 200, path


# ----- queue limit, disconnects --------------------------------------------------------------
@pytest.fixture(scope="module")
def single_seq(model):
    """One running sequence at most, one waiting request at most.

    Every step is paced (20 ms) so a long request is still running when a test looks:
    unpaced, the tiny model can finish 200 tokens before the next request arrives.
    """
    control = EngineControl(pace_seconds=0.02)
    control.paced.set()
    app = build_local_app(
        model,
        config(max_queue_len=1),
        on_engine=control.attach,
        max_num_seqs=1,
        **ENGINE,
    )
    with ThreadedServer(app) as server:
        server.wait_ready()
        yield server, control.engine


def open_stream(client: httpx.Client, max_tokens: int = 200) -> httpx.Response:
    body = {"prompt": "Go on", "max_tokens": max_tokens, "stream": True, **LONG}
    response = client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
    assert response.status_code == 200, response.read()
    return response


def test_queue_full_is_429_with_retry_after(single_seq):
    server, engine = single_seq
    with httpx.Client(base_url=server.url, timeout=30) as client:
        running = open_stream(client)
        next(running.iter_lines())  # the first token: it is running
        waiting = open_stream(client)  # admitted, waits for the only slot
        refused = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        running.close()
        waiting.close()
    wait_for(lambda: all_blocks_free(engine), message="blocks freed after the disconnects")


def test_disconnect_mid_stream_aborts_and_frees_blocks(single_seq):
    server, engine = single_seq
    metrics = context_of(server.app).metrics
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = open_stream(client)
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert len(received) >= 2
        assert not all_blocks_free(engine)
        response.close()
    wait_for(lambda: all_blocks_free(engine), message="blocks freed after the disconnect")
    wait_for(lambda: b'finished_reason="abort"' in metrics.render(), message="abort metric")


def test_disconnect_without_streaming_aborts_too(single_seq):
    server, engine = single_seq
    body = {"prompt": "Go on", "max_tokens": 200, **LONG}
    timeout = httpx.Timeout(30, read=0.5)
    with (
        httpx.Client(base_url=server.url, timeout=timeout) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/v1/completions", json=body)
    wait_for(lambda: all_blocks_free(engine), message="blocks freed after the disconnect")
    with httpx.Client(base_url=server.url, timeout=30) as client:  # and it still serves
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).is_success


def test_drain_refuses_new_work_and_aborts_after_timeout(single_seq):
    server, engine = single_seq
    async_engine = context_of(server.app).engine
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = open_stream(client, max_tokens=240)
        lines = response.iter_lines()
        next(lines)
        future = asyncio.run_coroutine_threadsafe(drain(async_engine, 0.2), async_engine._loop)
        wait_for(lambda: client.get("/health").status_code == 503, message="health 503")
        refused = client.post("/v1/completions", json={"prompt": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        rest = [line for line in lines if line]
        future.result(timeout=10)
    finals = [json.loads(line[6:]) for line in rest if line != "data: [DONE]"]
    assert finals[-1]["choices"][0]["finish_reason"] == "abort"
    assert rest[-1] == "data: [DONE]"
    wait_for(lambda: all_blocks_free(engine), message="blocks freed after the drain")
    async_engine.draining = False  # leave the shared server usable


def test_drain_still_admits_a_request_that_arrived_before_it(single_seq):
    """A request already in the server when the drain begins (e.g. compiling its
    constraint) is served to its end; one that arrives afterwards is refused with 503."""
    server, _ = single_seq
    async_engine = context_of(server.app).engine
    entered, released = threading.Event(), threading.Event()
    add_requests = async_engine.add_requests

    async def held_add_requests(*args, **kwargs):
        entered.set()
        while not released.is_set():
            await asyncio.sleep(0.01)
        return await add_requests(*args, **kwargs)

    async_engine.add_requests = held_add_requests
    answers: list[httpx.Response] = []
    body = {"prompt": "Go on", "max_tokens": 3, **LONG}
    client = httpx.Client(base_url=server.url, timeout=30)
    early = threading.Thread(
        target=lambda: answers.append(client.post("/v1/completions", json=body))
    )
    try:
        early.start()
        assert entered.wait(20), "the early request never reached the engine"
        future = asyncio.run_coroutine_threadsafe(drain(async_engine, 10), async_engine._loop)
        wait_for(lambda: client.get("/health").status_code == 503, message="health 503")
        released.set()
        early.join(30)
        assert answers[0].status_code == 200, answers[0].text
        assert answers[0].json()["usage"]["completion_tokens"] == 3
        late = client.post("/v1/completions", json=body)
        assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
        future.result(timeout=10)
    finally:
        released.set()
        async_engine.add_requests = add_requests
        async_engine.draining = False  # leave the shared server usable
        client.close()


# ----- engine death --------------------------------------------------------------------------
def test_engine_loop_death_turns_health_503(model):
    def break_step(engine) -> None:
        def step():
            raise RuntimeError("simulated engine failure")

        engine.step = step

    app = build_local_app(model, config(), on_engine=break_step, **ENGINE)
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        server.wait_ready()
        assert client.get("/health").status_code == 200
        failed = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert failed.status_code == 500 and failed.json()["error"]["code"] == "engine_dead"
        assert client.get("/health").status_code == 503
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 503


def test_engine_that_fails_to_load_keeps_health_503(model, tmp_path):
    (tmp_path / "config.json").write_text((Path(model) / "config.json").read_text())
    app = build_local_app(str(tmp_path), config(), **ENGINE)  # no weights, no tokenizer
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        engine = context_of(app).engine
        wait_for(lambda: engine.status == "failed", message="the load to fail")
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "failed"
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 503
