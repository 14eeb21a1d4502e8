"""Tool calling through the real openai client against a served tiny Qwen2 whose chat
template shows tools Hermes-style: named and ``required`` calls validate against the tools'
parameters, streamed calls assemble into valid calls, a tool-result round trip is
accepted, ``auto`` answers (parsed by the ``hermes`` parser), and bad input is a 400."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from octavo.entrypoints.openai.context import ServerConfig

from server_harness import ThreadedServer, openai_client, served_model
from tiny_models import build_tiny_model

MODEL = "tiny-tools"
TEMPLATE = """\
{%- if tools %}<|im_start|>system
Tools you may call:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}{% set f = call.function %}
<tool_call>{{ {"name": f.name, "arguments": f.arguments} | tojson }}</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
# Bounded arguments: a random model would otherwise fill a free string until max_tokens.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo", "Lima"]},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_folder(tmp_path_factory, smol_folder):
    """A tiny random Qwen2 whose chat template shows tools Hermes-style."""
    tokenizer = AutoTokenizer.from_pretrained(smol_folder)
    tokenizer.chat_template = TEMPLATE
    return build_tiny_model(tmp_path_factory.mktemp("tools"), "qwen2", tokenizer)


@pytest.fixture(scope="module")
def server(tools_folder) -> Iterator[ThreadedServer]:
    folder = tools_folder
    config = ServerConfig(
        served_model_names=[MODEL],
        model_root=MODEL,
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
    )
    with served_model(
        str(folder), config, 1, max_model_len=1024, kv_cache_memory=16 << 20
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


def parameters_of(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def assert_valid_call(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), parameters_of(name))


def test_a_named_function_is_called_with_valid_arguments(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=60
    ).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    (call,) = reply.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert_valid_call(call.function.name, call.function.arguments)


@pytest.mark.parametrize("parallel", [False, True])
def test_required_calls_validate_against_the_tools(client, parallel):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=200,
        parallel_tool_calls=parallel,
        temperature=0.8,
        seed=4,
    ).choices[0]
    assert reply.finish_reason == "tool_calls"
    calls = reply.message.tool_calls
    assert calls and (parallel or len(calls) == 1)
    for call in calls:
        assert_valid_call(call.function.name, call.function.arguments)
    assert len({call.id for call in calls}) == len(calls)


def assemble(stream) -> tuple[dict[int, dict], str | None]:
    """Streamed tool-call deltas put together by index, as a client does."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = piece.id or call["id"]
                call["name"] = (piece.function.name if piece.function else None) or call["name"]
                call["arguments"] += (piece.function.arguments if piece.function else "") or ""
    return calls, finish


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_a_streamed_tool_call_assembles_into_a_valid_call(client, tool_choice):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice=tool_choice,
        max_tokens=200,
        stream=True,
    )
    calls, finish = assemble(stream)
    assert finish == "tool_calls" and calls
    for call in calls.values():
        assert call["id"].startswith("call_")
        assert_valid_call(call["name"], call["arguments"])


def test_a_tool_result_round_trip(client):
    first = (
        client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200
        )
        .choices[0]
        .message
    )
    call = first.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert reply.choices[0].message.tool_calls in (None, [])
    assert reply.usage.prompt_tokens > 40  # the tools are not shown with "none"; history is


def test_auto_streamed_equals_auto_whole(client):
    """Greedy ``auto``: the streamed content and calls are the whole reply's (whether this
    random model wrote plain text or opened a <tool_call> block)."""
    kwargs = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 24, "temperature": 0}
    whole = client.chat.completions.create(**kwargs).choices[0]
    content, calls, finish = "", [], None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert content == (whole.message.content or "")
    assert [c.function.name for c in calls] == [c.function.name for c in whole.message.tool_calls]
    assert finish == whole.finish_reason
    if whole.message.tool_calls:
        assert whole.finish_reason == "tool_calls"


WEATHER_CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
TIME_CALL = {"name": "get_time", "arguments": {"zone": 2}}
CONTENT = "Sure."
# What the model writes: content, then two Hermes blocks (forced by a regex: the served
# path is the real one, from the engine's tokens to the parser and the stream).
SCRIPTED = CONTENT + "".join(
    f"<tool_call>{json.dumps(call)}</tool_call>" for call in (WEATHER_CALL, TIME_CALL)
)


def exactly(text: str) -> str:
    """A regex matching ``text`` only."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


def scripted_auto(client, parallel: bool, stream: bool):
    regex = {"structured_outputs": {"regex": exactly(SCRIPTED)}}
    return client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        max_tokens=300,
        temperature=0,
        parallel_tool_calls=parallel,
        stream=stream,
        extra_body=regex,
    )


def call_dicts(calls) -> list[dict]:
    return [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in calls]


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_reads_the_calls_the_model_wrote(client, parallel):
    """``auto``: the Hermes blocks become calls, the text before them content; with
    ``parallel_tool_calls: false`` only the first call is kept."""
    reply = scripted_auto(client, parallel, stream=False).choices[0]
    assert reply.finish_reason == "tool_calls"
    assert reply.message.content == CONTENT
    expected = [WEATHER_CALL, TIME_CALL] if parallel else [WEATHER_CALL]
    assert call_dicts(reply.message.tool_calls) == expected
    assert all(call.id.startswith("call_") for call in reply.message.tool_calls)


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_streams_the_content_then_the_calls(client, parallel):
    """Streamed ``auto``: the content goes out as it is written and never a piece of a
    ``<tool_call>`` tag; the calls come whole at the end, as in the whole reply."""
    contents, calls, finish = [], [], None
    for chunk in scripted_auto(client, parallel, stream=True):
        for choice in chunk.choices:
            contents.append(choice.delta.content or "")
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert "".join(contents) == CONTENT and not any("<" in piece for piece in contents)
    assert finish == "tool_calls"
    assert [call.index for call in calls] == list(range(len(calls)))
    assert call_dicts(calls) == ([WEATHER_CALL, TIME_CALL] if parallel else [WEATHER_CALL])


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "launch"}}},
            "tool_choice",
            "not among the tools",
        ),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
            "constrains the output already",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools", "distinct"),
    ],
)
def test_bad_tool_requests_are_400(server, extra, param, message):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4, **extra}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"]


def test_offline_chat_shows_the_tools_to_the_template(tools_folder):
    """``LLM.chat(messages, tools=...)`` renders the tools as the server does."""
    from octavo import LLM, SamplingParams

    llm = LLM(str(tools_folder), dtype="float32", max_model_len=512)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    (with_tools,) = llm.chat(ASK, params, use_tqdm=False, tools=TOOLS)
    (without,) = llm.chat(ASK, params, use_tqdm=False)
    assert '"name": "get_weather"' in with_tools.prompt
    assert "get_weather" not in without.prompt
