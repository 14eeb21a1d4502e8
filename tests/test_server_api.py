"""The OpenAI-compatible server's endpoints, on a real uvicorn server and a tiny model."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from octavo.entrypoints.openai.context import ServerConfig

from server_harness import ThreadedServer, build_local_app, metric_samples

MODEL = "tiny"
MAX_MODEL_LEN = 128
LONG = {"ignore_eos": True, "temperature": 0}  # deterministic and exactly max_tokens long


@pytest.fixture(scope="module")
def server(tiny_folder):
    config = ServerConfig(served_model_names=[MODEL], model_root="tiny", max_body_bytes=64_000)
    app = build_local_app(
        str(tiny_folder("llama3")),
        config,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory=4 << 20,
        max_num_seqs=8,
    )
    with ThreadedServer(app) as running:
        yield running.wait_ready()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def sse_events(response: httpx.Response) -> list[str]:
    """The data payloads of an SSE body; checks the framing on the way."""
    blocks = response.text.split("\n\n")
    assert blocks[-1] == ""
    assert all(block.startswith("data: ") for block in blocks[:-1])
    return [block.removeprefix("data: ") for block in blocks[:-1]]


def complete(client: httpx.Client, **body) -> dict:
    response = client.post("/v1/completions", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


# ----- simple endpoints ------------------------------------------------------------------
def test_health_version_models(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/version").json()["version"]
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [card["id"] for card in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN


def test_tokenize_detokenize_round_trip(client):
    tokens = client.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    assert tokens["max_model_len"] == MAX_MODEL_LEN
    text = client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "Hello world"
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.json()["count"] > 5  # the chat template adds its markers
    assert client.post("/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_request_id_echoed_or_generated(client):
    echoed = client.get("/health", headers={"X-Request-Id": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    assert len(client.get("/health").headers["x-request-id"]) >= 16
    failing = client.post("/v1/completions", json={}, headers={"X-Request-Id": "e-1"})
    assert failing.status_code == 400 and failing.headers["x-request-id"] == "e-1"


# ----- completions -----------------------------------------------------------------------
def test_completion_usage_and_shape(client):
    body = complete(client, prompt="Hello there", max_tokens=5, **LONG)
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and choice["text"]
    prompt_tokens = client.post("/tokenize", json={"prompt": "Hello there"}).json()["count"]
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": prompt_tokens + 5,
    }
    # OpenAI's newer name is taken too (the llm-d routing sidecar sends both, equal) and
    # wins over max_tokens, as in chat
    body = complete(client, prompt="Hello there", max_tokens=5, max_completion_tokens=2, **LONG)
    assert body["usage"]["completion_tokens"] == 2


def test_completion_prompt_forms_and_n(client):
    ids = client.post("/tokenize", json={"prompt": "Once upon"}).json()["tokens"]
    by_text = complete(client, prompt="Once upon", max_tokens=4, **LONG)["choices"][0]["text"]
    by_ids = complete(client, prompt=ids, max_tokens=4, **LONG)["choices"][0]["text"]
    assert by_ids == by_text
    body = complete(client, prompt=["Once upon", "A B C"], n=2, max_tokens=3, **LONG)
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2, 3]
    assert body["choices"][0]["text"] == by_text[: len(body["choices"][0]["text"])]
    assert body["usage"]["completion_tokens"] == 12
    lists = complete(client, prompt=[ids, ids], max_tokens=4, **LONG)
    assert [choice["text"] for choice in lists["choices"]] == [by_text, by_text]


def test_completion_echo(client):
    plain = complete(client, prompt="Echo me", max_tokens=3, **LONG)["choices"][0]["text"]
    echoed = complete(client, prompt="Echo me", max_tokens=3, echo=True, **LONG)
    assert echoed["choices"][0]["text"] == "Echo me" + plain


def test_completion_logprobs_legacy_format(client):
    body = complete(client, prompt="Hello", max_tokens=4, logprobs=3, **LONG)
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 4
    assert "".join(logprobs["tokens"]) == body["choices"][0]["text"]
    assert logprobs["text_offset"][0] == 0
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    for token, value, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert value <= 0 and 3 <= len(top) <= 4 and top[token] == value
        assert max(top.values()) >= value  # greedy: the chosen token is the most likely


def test_completion_stream_matches_non_stream(client):
    body = {"model": MODEL, "prompt": "Stream this", "max_tokens": 6, **LONG}
    full = complete(client, **{k: v for k, v in body.items() if k != "model"})
    streamed = client.post(
        "/v1/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_events(streamed)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    text = "".join(choice["text"] for chunk in chunks[:-1] for choice in chunk["choices"])
    assert text == full["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])


def test_a_stream_interval_sends_fewer_chunks_of_the_same_text(client):
    """vLLM's request field: the first token at once, then chunks of 4 tokens, the last."""
    body = {"model": MODEL, "prompt": "Stream this", "max_tokens": 9, "stream": True, **LONG}
    body["stream_options"] = {"include_usage": True}

    def chunks(**extra) -> list[dict]:
        events = sse_events(client.post("/v1/completions", json={**body, **extra}))
        return [json.loads(event) for event in events[:-1]]

    def text(of: list[dict]) -> str:
        return "".join(choice["text"] for chunk in of for choice in chunk["choices"])

    every, grouped = chunks(), chunks(stream_interval=4)
    assert text(grouped) == text(every) and grouped[-1]["usage"] == every[-1]["usage"]
    # the engine's outputs of 1 + 4 + 4 tokens, then the usage (a slow reader of either
    # stream may see outputs merged, never split)
    assert 2 <= len(grouped) <= 4
    whole = text(every)  # a stop string inside a chunk: the text and usage end there
    stop = next(whole[i : i + 2] for i in range(2, 7) if whole.find(whole[i : i + 2]) == i)
    stopped, stopped_grouped = chunks(stop=[stop]), chunks(stop=[stop], stream_interval=4)
    assert text(stopped_grouped) == text(stopped) == whole[: whole.find(stop)]
    assert stopped_grouped[-1]["usage"] == stopped[-1]["usage"]
    refused = client.post("/v1/completions", json={**body, "stream_interval": 0})
    assert refused.status_code == 400 and "stream_interval" in refused.text


def test_stream_without_include_usage_has_no_usage(client):
    response = client.post(
        "/v1/completions",
        json={"prompt": ["a", "b"], "max_tokens": 2, "stream": True, "n": 2, **LONG},
    )
    chunks = [json.loads(event) for event in sse_events(response)[:-1]]
    assert all("usage" not in chunk for chunk in chunks)
    finished = {c["index"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]}
    assert finished == {0, 1, 2, 3}


def _stop_candidate(text: str) -> tuple[str, int]:
    """A 3-character piece of ``text`` whose first occurrence is not at the start."""
    for start in range(1, len(text) - 3):
        piece = text[start : start + 3]
        if text.find(piece) == start and piece.strip():
            return piece, start
    pytest.skip(reason="the generated text has no usable stop string")


def test_stop_string_is_trimmed(client):
    """Found by the core (a whole answer) and by the server (a stream: the core runs
    without it and is told to abort), the same text, finish and usage; the stream counts
    once in the metrics, as stopped (not as the abort the core then reports)."""
    text = complete(client, prompt="Stop test", max_tokens=12, **LONG)["choices"][0]["text"]
    stop, position = _stop_candidate(text)
    body = complete(client, prompt="Stop test", max_tokens=12, stop=[stop], **LONG)
    choice = body["choices"][0]
    assert choice["text"] == text[:position]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    before = client.get("/metrics").text
    streamed = client.post(
        "/v1/completions",
        json={
            **{"prompt": "Stop test", "max_tokens": 12, "stop": stop, "stream": True, **LONG},
            "stream_options": {"include_usage": True},
        },
    )
    chunks = [json.loads(event) for event in sse_events(streamed)[:-1]]
    assert "".join(c["text"] for chunk in chunks for c in chunk["choices"]) == text[:position]
    last = [c for chunk in chunks for c in chunk["choices"]][-1]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", stop)
    assert chunks[-1]["usage"] == body["usage"]
    deadline = time.monotonic() + 30
    while True:  # until the core has taken the abort (its last output for the request)
        after = client.get("/metrics").text
        if _sample(after, "vllm:num_requests_running") == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    def finished(scrape: str, reason: str) -> float:
        return sum(metric_samples(scrape, "vllm:request_success_total", finished_reason=reason))

    assert _sample(after, "vllm:num_requests_running") == 0
    assert finished(after, "stop") == finished(before, "stop") + 1
    assert finished(after, "abort") == finished(before, "abort")


def test_seed_makes_sampling_reproducible(client):
    body = {"prompt": "Random", "max_tokens": 8, "temperature": 1.0, "seed": 7}
    first = complete(client, **body)["choices"][0]["text"]
    assert complete(client, **body)["choices"][0]["text"] == first


# ----- chat --------------------------------------------------------------------------------
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def chat(client: httpx.Client, **body) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"messages": MESSAGES, **body})


def test_chat_completion_with_logprobs(client):
    response = chat(client, max_completion_tokens=4, logprobs=True, top_logprobs=2, **LONG)
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    content = choice["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] == 4
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    for entry in content:
        assert entry["logprob"] <= 0 and isinstance(entry["bytes"], list)
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-6
    chat_prompt = client.post("/tokenize", json={"messages": MESSAGES}).json()
    assert body["usage"]["prompt_tokens"] == chat_prompt["count"]


def test_chat_stream_n2_usage_and_done(client):
    full = chat(client, max_tokens=5, **LONG).json()
    response = chat(
        client, max_tokens=5, n=2, stream=True, stream_options={"include_usage": True}, **LONG
    )
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "")
    assert texts == {0: full["choices"][0]["message"]["content"]} | {1: texts[1]}
    assert texts[1] == texts[0]  # greedy: both choices agree
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 10
    assert usage["prompt_tokens"] == full["usage"]["prompt_tokens"]


def test_chat_response_format_text_and_content_parts(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    response = client.post(
        "/v1/chat/completions",
        json={"messages": messages, "max_tokens": 2, "response_format": {"type": "text"}},
    )
    assert response.status_code == 200, response.text


# ----- errors ------------------------------------------------------------------------------
def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # tools with 'auto' (their default) and no --tool-call-parser
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, None),  # no name
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"top_logprobs": 2}, None),
        ({"frobnicate": True}, "frobnicate"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None),
        ({"stream": True, "kv_transfer_params": {"do_remote_decode": True}}, None),
    ],
)
def test_chat_validation_errors_are_400(client, body, param):
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    error = assert_error(client.post("/v1/chat/completions", json={**base, **body}), 400, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": ""},
        {"prompt": []},
        {"prompt": ["a", [1, 2]]},
        {"prompt": [10**9]},
        {"prompt": "x", "logprobs": 21},
        {"prompt": "x", "echo": True, "logprobs": 1, "stream": True},  # scoring: no stream
        {"prompt": "x", "temperature": -1},
        {"prompt": "x", "min_tokens": 5, "max_tokens": 2},
        {"prompt": "x", "stream_options": {"include_usage": True}},
        # P/D: a prefill's params come back in a non-streamed body, for one prompt's blocks
        {"prompt": "x", "stream": True, "kv_transfer_params": {"do_remote_decode": True}},
        {"prompt": ["a", "b"], "kv_transfer_params": {"do_remote_decode": True}},
    ],
)
def test_completion_validation_errors_are_400(client, body):
    assert_error(client.post("/v1/completions", json=body), 400)


def test_malformed_json_is_400(client):
    response = client.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(response, 400)


def test_over_max_model_len_is_400(client):
    error = assert_error(
        client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": MAX_MODEL_LEN}),
        400,
        "max_tokens",
    )
    assert str(MAX_MODEL_LEN) in error["message"]
    long_prompt = list(range(1, MAX_MODEL_LEN + 1))
    assert_error(client.post("/v1/completions", json={"prompt": long_prompt}), 400, "prompt")
    messages = [{"role": "user", "content": "hi"}]
    response = client.post(
        "/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 500}
    )
    assert_error(response, 400, "max_tokens")


def test_unknown_model_is_404_and_missing_model_is_fine(client):
    response = client.post("/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert assert_error(response, 404, "model")["code"] == "model_not_found"
    response = client.post("/v1/chat/completions", json={"model": "nope", "messages": []})
    assert response.status_code in (400, 404)
    assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).is_success


def test_oversized_body_is_413(client):
    big = {"prompt": "x" * 100_000}
    assert_error(client.post("/v1/completions", json=big), 413)

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'"}'

    response = client.post(
        "/v1/completions", content=chunked(), headers={"content-type": "application/json"}
    )
    assert_error(response, 413)


def test_unknown_route_is_404_in_openai_shape(client):
    assert_error(client.get("/v1/nothing-here"), 404)


# ----- metrics -----------------------------------------------------------------------------
VLLM_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_count",
)


def _sample(text: str, prefix: str) -> float:
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    ]
    assert values, prefix
    return sum(values)


def test_metrics_use_vllm_names(client):
    complete(client, prompt="metrics", max_tokens=3, **LONG)
    complete(client, prompt="metrics", max_tokens=3, **LONG)  # a prefix-cache hit
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name in VLLM_METRICS:
        assert f'{name}{{model_name="{MODEL}"' in text or f"{name}{{" in text, name
    assert _sample(text, 'vllm:request_success_total{finished_reason="length"') >= 2
    assert _sample(text, "vllm:generation_tokens_total") >= 6
    assert _sample(text, "vllm:prompt_tokens_total") > 0
    assert _sample(text, "vllm:prefix_cache_queries_total") > 0
    assert _sample(text, "vllm:inter_token_latency_seconds_count") >= 4
    assert _sample(text, "vllm:num_requests_running") == 0
