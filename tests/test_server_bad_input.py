"""The bad-input matrix on one real server: every refusal has the right status and OpenAI's
error shape, and the server is healthy afterwards.

The server requires an API key, takes one running and one waiting request at most, caps
bodies at 16 kB and contexts at 128 tokens; its model load is held back at first so the
"not ready" 503 can be seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from octavo.entrypoints.openai.context import ServerConfig

from server_harness import (
    EngineControl,
    ThreadedServer,
    build_local_app,
    torch_threads,
)

MODEL = "tiny"
API_KEY = "sekret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_MODEL_LEN = 128
MAX_BODY_BYTES = 16_000
HI = [{"role": "user", "content": "hi"}]
LONG = {"ignore_eos": True, "temperature": 0}


@dataclass
class Running:
    server: ThreadedServer
    control: EngineControl

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.server.url, headers=AUTH, timeout=30, **kwargs)


@pytest.fixture(scope="module")
def running(tiny_folder) -> Iterator[Running]:
    control = EngineControl(loaded=False)
    config = ServerConfig(
        served_model_names=[MODEL],
        model_root=MODEL,
        api_key=API_KEY,
        max_queue_len=1,
        max_body_bytes=MAX_BODY_BYTES,
    )
    app = build_local_app(
        str(tiny_folder("llama3")),
        config,
        on_engine=control.attach,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory=4 << 20,
        max_num_seqs=1,
    )
    with torch_threads(1), ThreadedServer(app) as server:
        yield Running(server, control)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """The status, and OpenAI's error body: {"error": {message, type, param, code}}."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if code is not None:
        assert error["code"] == code, error
    return error


def completion(**body: Any) -> Callable[[httpx.Client], httpx.Response]:
    return lambda client: client.post("/v1/completions", json={"model": MODEL, **body})


def chat(**body: Any) -> Callable[[httpx.Client], httpx.Response]:
    return lambda client: client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2, **body}
    )


def raw(path: str, content: bytes, **headers: str) -> Callable[[httpx.Client], httpx.Response]:
    headers = {"content-type": "application/json", **headers}
    return lambda client: client.post(path, content=content, headers=headers)


def chunked_body(size: int) -> Iterator[bytes]:
    """A JSON body sent without Content-Length (the limit is enforced while reading)."""
    yield b'{"prompt": "'
    for _ in range(size // 1000):
        yield b"x" * 1000
    yield b'"}'


TOO_LONG_PROMPT = list(range(1, MAX_MODEL_LEN + 1))
TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}
# (case name, request, status, error type, error param or None, error code or None)
MATRIX: list[tuple[str, Callable[[httpx.Client], httpx.Response], int, str, Any, Any]] = [
    # 400: validation, including fields the server does not support
    # tools with 'auto' (their default) and no --tool-call-parser
    ("chat tools", chat(tools=[TOOL]), 400, "invalid_request_error", "tool_choice", None),
    (
        "chat functions",
        chat(functions=[{"name": "f"}]),
        400,
        "invalid_request_error",
        "functions",
        None,
    ),
    (
        "chat tool_choice",
        chat(tool_choice="required"),
        400,
        "invalid_request_error",
        "tool_choice",
        None,
    ),
    (
        "chat unknown response format",
        chat(response_format={"type": "xml"}),
        400,
        "invalid_request_error",
        "response_format.type",
        None,
    ),
    (
        "chat invalid json schema",
        chat(guided_json={"type": "object", "properties": 3}),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    (
        "chat audio",
        chat(audio={"voice": "alloy", "format": "mp3"}),
        400,
        "invalid_request_error",
        "audio",
        None,
    ),
    (
        "chat image part",
        chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    ("chat no messages", chat(messages=[]), 400, "invalid_request_error", "messages", None),
    (
        "chat bad role",
        chat(messages=[{"role": "wizard", "content": "x"}]),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    ("chat top_logprobs alone", chat(top_logprobs=2), 400, "invalid_request_error", None, None),
    (
        "logit_bias",
        completion(prompt="x", logit_bias={"1": 5}),
        400,
        "invalid_request_error",
        "logit_bias",
        None,
    ),
    (
        "unknown field",
        completion(prompt="x", frobnicate=1),
        400,
        "invalid_request_error",
        "frobnicate",
        None,
    ),
    (
        "wrong type",
        completion(prompt="x", max_tokens="many"),
        400,
        "invalid_request_error",
        "max_tokens",
        None,
    ),
    ("n=0", completion(prompt="x", n=0), 400, "invalid_request_error", "n", None),
    (
        "temperature<0",
        completion(prompt="x", temperature=-1),
        400,
        "invalid_request_error",
        "temperature",
        None,
    ),
    ("missing prompt", completion(), 400, "invalid_request_error", "prompt", None),
    ("empty prompt", completion(prompt=""), 400, "invalid_request_error", "prompt", None),
    (
        "token id out of range",
        completion(prompt=[10**9]),
        400,
        "invalid_request_error",
        "prompt",
        None,
    ),
    (
        "empty stop string",
        completion(prompt="x", stop=[""]),
        400,
        "invalid_request_error",
        "stop",
        None,
    ),
    ("suffix", completion(prompt="x", suffix="y"), 400, "invalid_request_error", "suffix", None),
    (
        "malformed json",
        raw("/v1/completions", b"{not json"),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    (
        "NaN",
        raw("/v1/completions", b'{"prompt": "x", "temperature": NaN}'),
        400,
        "invalid_request_error",
        "temperature",
        None,
    ),
    (
        "Infinity",
        raw("/v1/completions", b'{"prompt": "x", "repetition_penalty": Infinity}'),
        400,
        "invalid_request_error",
        "repetition_penalty",
        None,
    ),
    # JSON escapes of lone UTF-16 surrogates decode to strings that are not Unicode text
    (
        "lone surrogate prompt",
        raw("/v1/completions", rb'{"prompt": "\ud800"}'),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    (
        "lone surrogate chat",
        raw("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "a\udfff"}]}'),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    (
        "lone surrogate model",
        raw("/v1/completions", rb'{"model": "\udc00", "prompt": "x"}'),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    (
        "lone surrogate tokenize",
        raw("/tokenize", rb'{"prompt": "\ud83d"}'),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    (
        "body not an object",
        raw("/v1/chat/completions", b"[1, 2]"),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    (
        "tokenize both inputs",
        lambda c: c.post("/tokenize", json={"prompt": "x", "messages": HI}),
        400,
        "invalid_request_error",
        None,
        None,
    ),
    (
        "detokenize bad id",
        lambda c: c.post("/detokenize", json={"tokens": [-1]}),
        400,
        "invalid_request_error",
        "tokens",
        None,
    ),
    # 400: longer than max_model_len
    (
        "prompt over max_model_len",
        completion(prompt=TOO_LONG_PROMPT),
        400,
        "invalid_request_error",
        "prompt",
        None,
    ),
    (
        "max_tokens over max_model_len",
        completion(prompt="x", max_tokens=MAX_MODEL_LEN),
        400,
        "invalid_request_error",
        "max_tokens",
        None,
    ),
    (
        "chat over max_model_len",
        chat(max_completion_tokens=MAX_MODEL_LEN),
        400,
        "invalid_request_error",
        "max_tokens",
        None,
    ),
    (
        "chat messages over max_model_len",
        chat(messages=[{"role": "user", "content": "hi " * 200}]),
        400,
        "invalid_request_error",
        "messages",
        None,
    ),
    # 404: unknown model or route; 405: wrong method
    (
        "unknown model",
        completion(model="gpt-4o", prompt="x"),
        404,
        "invalid_request_error",
        "model",
        "model_not_found",
    ),
    (
        "unknown chat model",
        chat(model="gpt-4o"),
        404,
        "invalid_request_error",
        "model",
        "model_not_found",
    ),
    ("unknown route", lambda c: c.get("/v1/engines"), 404, "invalid_request_error", None, None),
    ("wrong method", lambda c: c.get("/v1/completions"), 405, "invalid_request_error", None, None),
    # 413: bodies over the limit, declared or streamed
    (
        "oversized body",
        completion(prompt="x" * 2 * MAX_BODY_BYTES),
        413,
        "invalid_request_error",
        None,
        "request_too_large",
    ),
    (
        "oversized chunked body",
        lambda c: c.post(
            "/v1/completions",
            content=chunked_body(2 * MAX_BODY_BYTES),
            headers={"content-type": "application/json"},
        ),
        413,
        "invalid_request_error",
        None,
        None,
    ),
]


def test_not_ready_is_503_then_ready(running):
    """Before the model has loaded: /health and generation answer 503 "loading"."""
    if running.control.loaded.is_set():
        pytest.skip(reason="the model already loaded (this test must run first in the module)")
    with running.client() as client:
        assert_error(client.get("/health"), 503, "loading")
        error = assert_error(completion(prompt="x")(client), 503, "loading")
        assert error["type"] == "service_unavailable"
        assert_error(chat()(client), 503, "loading")
        assert_error(client.post("/tokenize", json={"prompt": "x"}), 503, "loading")
    running.control.loaded.set()
    running.server.wait_ready()


@pytest.fixture
def ready(running) -> Running:
    running.control.loaded.set()
    running.server.wait_ready()
    return running


@pytest.mark.parametrize(
    ("request_of", "status", "type_", "param", "code"),
    [pytest.param(*case[1:], id=case[0]) for case in MATRIX],
)
def test_bad_input_matrix(ready, request_of, status, type_, param, code):
    with ready.client() as client:
        error = assert_error(request_of(client), status, code)
    assert error["type"] == type_
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"}],
    ids=["missing", "wrong", "not bearer"],
)
def test_bad_api_key_is_401(ready, headers):
    with httpx.Client(base_url=ready.server.url, headers=headers, timeout=30) as client:
        for response in (client.get("/v1/models"), completion(prompt="x")(client)):
            error = assert_error(response, 401, "invalid_api_key")
            assert error["type"] == "authentication_error"
            assert response.headers["www-authenticate"] == "Bearer"
        assert client.get("/health").status_code == 200  # probes need no key


def open_stream(client: httpx.Client) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Go on", "max_tokens": 100, "stream": True, **LONG}
    request = client.build_request("POST", "/v1/completions", json=body)
    response = client.send(request, stream=True)
    assert response.status_code == 200, response.read()
    return response


def test_queue_full_is_429_with_retry_after(ready):
    ready.control.paced.set()  # slow steps: the first request keeps running meanwhile
    try:
        with ready.client() as client:
            running = open_stream(client)
            next(running.iter_lines())  # a token arrived: it holds the only running slot
            waiting = open_stream(client)  # accepted: it waits for that slot
            # held: however loaded the machine, the first cannot finish and free its slot
            # (a CI run once took longer than its 100 paced steps to send the next request)
            ready.control.steps_open.clear()
            for request_of in (completion(prompt="x", max_tokens=1), chat()):
                response = request_of(client)
                error = assert_error(response, 429, "queue_full")
                assert error["type"] == "rate_limit_error"
                assert response.headers["retry-after"] == "1"
            running.close()
            waiting.close()
    finally:
        ready.control.steps_open.set()
        ready.control.paced.clear()


def test_openai_client_gets_typed_errors(ready):
    """The same refusals as the `openai` package reports them (no retries)."""
    base = f"{ready.server.url}/v1"
    good = openai.OpenAI(base_url=base, api_key=API_KEY, max_retries=0, timeout=30)
    bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.models.list()
    assert caught.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as caught:
        good.chat.completions.create(model="gpt-4o", messages=HI)
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    with pytest.raises(openai.BadRequestError) as caught:
        good.chat.completions.create(model=MODEL, messages=HI, tools=[TOOL])
    assert caught.value.param == "tool_choice"  # 'auto' needs --tool-call-parser
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        good.completions.create(model=MODEL, prompt="x", max_tokens=MAX_MODEL_LEN)
    with pytest.raises(openai.APIStatusError) as caught:
        good.completions.create(model=MODEL, prompt="x" * 2 * MAX_BODY_BYTES)
    assert caught.value.status_code == 413


def test_server_is_healthy_after_the_matrix(ready):
    """Runs last: nothing above left the server broken or holding KV blocks."""
    with ready.client() as client:
        assert client.get("/health").json() == {"status": "ok"}
        body = completion(prompt="still here", max_tokens=3, **LONG)(client)
        assert body.status_code == 200 and body.json()["usage"]["completion_tokens"] == 3
        pair = raw("/v1/completions", rb'{"prompt": "\ud83d\ude00", "max_tokens": 1}')(client)
        assert pair.status_code == 200, pair.text  # a surrogate pair is fine: an emoji
        reply = chat(max_tokens=2, **LONG)(client)
        assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"]
        stream = client.post(
            "/v1/completions",
            json={"prompt": "x", "max_tokens": 2, "stream": True, **LONG},
        )
        assert stream.text.endswith("data: [DONE]\n\n")
        assert client.get("/health").status_code == 200
    assert wait_until(ready.control.is_idle), "requests or KV blocks left in the engine"


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
