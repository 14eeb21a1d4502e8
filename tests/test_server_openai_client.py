"""The official `openai` client, unmodified (only base_url and api_key set), on real uvicorn.

Most tests use the tiny random Llama (fast; its text is noise, so they check structure,
counts and determinism); the SmolLM2 tests check that real text comes through.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from octavo.entrypoints.openai.context import ServerConfig

from conftest import running_tiny_server
from server_harness import ThreadedServer, build_local_app

MODEL = "SmolLM2-135M-Instruct"
TINY = "tiny"
QUESTION = [{"role": "user", "content": "What is 2+2?"}]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me a story about a lighthouse."},
]
PROMPT = "The lighthouse keeper said"
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}  # exactly max_tokens long


def make_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def client(smol_folder) -> Iterator[openai.OpenAI]:
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    app = build_local_app(str(smol_folder), config, max_model_len=512, kv_cache_memory=32 << 20)
    with ThreadedServer(app) as server:
        server.wait_ready()
        yield make_client(server.url)


@pytest.fixture(scope="module")
def tiny(tiny_folder) -> Iterator[openai.OpenAI]:
    with running_tiny_server(tiny_folder, TINY) as url:
        yield make_client(url)


@pytest.fixture(scope="module")
def tokenizer(tiny_folder) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_folder("llama3"))


def templated_prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """What the chat template makes of ``messages``, counted by the model's tokenizer."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=TINY, messages=MESSAGES, **kwargs)


def complete(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.completions.create(model=TINY, prompt=PROMPT, **kwargs)


# ----- chat completions (tiny model) -------------------------------------------------------
def test_chat_usage_and_top_logprobs(tiny, tokenizer):
    response = chat(tiny, max_tokens=6, logprobs=True, top_logprobs=3, **GREEDY)
    assert response.object == "chat.completion" and response.model == TINY
    (choice,) = response.choices
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    content = choice.logprobs.content
    assert "".join(entry.token for entry in content) == choice.message.content
    usage = response.usage
    assert usage.prompt_tokens == templated_prompt_tokens(tokenizer, MESSAGES)
    assert usage.completion_tokens == len(content) == 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        alternatives = [top.logprob for top in entry.top_logprobs]
        assert alternatives == sorted(alternatives, reverse=True)
        assert entry.logprob == pytest.approx(alternatives[0], abs=1e-5)  # greedy = argmax
        assert_bytes_match(entry.token, entry.bytes)


def assert_bytes_match(token: str, raw: list[int]) -> None:
    """``bytes`` are the token's UTF-8 bytes (a token may hold part of a character)."""
    assert raw and all(0 <= byte < 256 for byte in raw)
    try:
        assert bytes(raw).decode("utf-8") == token
    except UnicodeDecodeError:
        assert "\ufffd" in token  # the decoded text shows the partial character


def test_chat_stream_n2_matches_non_stream(tiny, tokenizer):
    full = chat(tiny, max_tokens=5, **GREEDY)
    stream = chat(
        tiny, max_tokens=5, n=2, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    texts, reasons, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    expected = full.choices[0].message.content
    assert texts == {0: expected, 1: expected}  # greedy: both choices are the same
    assert reasons == {0: "length", 1: "length"}
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert usage.prompt_tokens == templated_prompt_tokens(tokenizer, MESSAGES)
    assert usage.completion_tokens == 10


def test_chat_stop_string(tiny):
    text = chat(tiny, max_tokens=16, **GREEDY).choices[0].message.content
    stop, position = stop_candidate(text)
    stopped = chat(tiny, max_tokens=16, stop=[stop], **GREEDY).choices[0]
    assert stopped.message.content == text[:position]
    assert stopped.finish_reason == "stop"
    stream = chat(tiny, max_tokens=16, stop=stop, stream=True, **GREEDY)
    chunks = [choice for chunk in stream for choice in chunk.choices]
    assert "".join(choice.delta.content or "" for choice in chunks) == text[:position]
    assert chunks[-1].finish_reason == "stop"


def test_chat_seed_reproducible(tiny):
    def sample(seed: int) -> list[str]:
        response = chat(tiny, max_tokens=8, n=2, temperature=1.0, seed=seed)
        return [choice.message.content for choice in response.choices]

    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(seed) != first for seed in (1, 2, 3))


# ----- completions (tiny model) ------------------------------------------------------------
def test_completion_usage_and_logprobs(tiny, tokenizer):
    response = complete(tiny, max_tokens=7, logprobs=2, **GREEDY)
    assert response.object == "text_completion"
    (choice,) = response.choices
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    assert response.usage.prompt_tokens == len(tokenizer(PROMPT)["input_ids"])
    assert response.usage.completion_tokens == len(logprobs.tokens) == 7
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0
    for token, value, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert value <= 0 and len(top) >= 2 and top[token] == pytest.approx(value)
        assert max(top.values()) == pytest.approx(value, abs=1e-5)  # greedy = argmax


def test_completion_stream_and_n2(tiny, tokenizer):
    full = complete(tiny, max_tokens=6, **GREEDY)
    both = complete(tiny, max_tokens=6, n=2, **GREEDY)
    assert [choice.index for choice in both.choices] == [0, 1]
    assert [choice.text for choice in both.choices] == [full.choices[0].text] * 2
    assert both.usage.completion_tokens == 12
    assert both.usage.prompt_tokens == full.usage.prompt_tokens
    stream = complete(
        tiny, max_tokens=6, n=2, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    texts, reasons, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    assert texts == {0: full.choices[0].text, 1: full.choices[0].text}
    assert reasons == {0: "length", 1: "length"}
    assert usage.completion_tokens == 12
    assert usage.prompt_tokens == len(tokenizer(PROMPT)["input_ids"])


def test_completion_stop_string(tiny):
    text = complete(tiny, max_tokens=16, **GREEDY).choices[0].text
    stop, position = stop_candidate(text)
    stopped = complete(tiny, max_tokens=16, stop=[stop], **GREEDY).choices[0]
    assert stopped.text == text[:position] and stopped.finish_reason == "stop"
    stream = complete(tiny, max_tokens=16, stop=stop, stream=True, **GREEDY)
    chunks = [choice for chunk in stream for choice in chunk.choices]
    assert "".join(choice.text for choice in chunks) == text[:position]
    assert chunks[-1].finish_reason == "stop"


def test_completion_seed_reproducible(tiny):
    def sample(seed: int) -> str:
        return complete(tiny, max_tokens=8, temperature=1.0, seed=seed).choices[0].text

    first = sample(99)
    assert sample(99) == first
    assert any(sample(seed) != first for seed in (1, 2, 3))


def stop_candidate(text: str) -> tuple[str, int]:
    """A 3-character piece of ``text`` first found after its start: a stop string to try."""
    for start in range(1, len(text) - 3):
        piece = text[start : start + 3]
        if text.find(piece) == start and piece.strip():
            return piece, start
    pytest.fail(f"no usable stop string in {text!r}")


def test_tiny_errors_reach_the_client_typed(tiny):
    with pytest.raises(openai.NotFoundError) as not_found:
        tiny.completions.create(model="gpt-4o", prompt="x", max_tokens=1)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        chat(tiny, max_tokens=1, tools=[{"type": "function", "function": {"name": "f"}}])
    # tools with 'auto' (their default) need --tool-call-parser
    assert bad.value.param == "tool_choice" and bad.value.type == "invalid_request_error"


# ----- SmolLM2: real text ------------------------------------------------------------------
@pytest.mark.slow
def test_chat_completion_streaming_and_not(client):
    full = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=12, temperature=0
    )
    answer = full.choices[0].message.content
    assert full.choices[0].message.role == "assistant"
    assert "4" in answer
    assert full.usage.completion_tokens <= 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


@pytest.mark.slow
def test_completion_real_text(client):
    response = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=1
    )
    choice = response.choices[0]
    assert "Paris" in choice.text
    assert "".join(choice.logprobs.tokens) == choice.text
    assert response.usage.completion_tokens == len(choice.logprobs.tokens)


@pytest.mark.slow
def test_client_sees_openai_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.slow
def test_smollm2_calls_tools_through_the_fallback_prompt(client):
    """SmolLM2's template never uses tools: they reach it as text (--tool-prompt-fallback),
    the required call names the city asked about, and the tool result gets an answer."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ask,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=40,
        temperature=0,
    ).choices[0]
    (call,) = reply.message.tool_calls
    assert reply.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    result = {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}
    answer = (
        client.chat.completions.create(
            model=MODEL,
            messages=[*ask, reply.message.model_dump(exclude_none=True), result],
            max_tokens=30,
            temperature=0,
        )
        .choices[0]
        .message.content
    )
    assert answer.strip()  # (what a 135M model makes of the result is its own business)
