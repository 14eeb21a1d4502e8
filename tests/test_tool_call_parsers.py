"""Tool calls read from canned model outputs by each parser, and ``tool_choice`` turned
into constraints whose outputs become calls (the xgrammar compile of those schemas too)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from octavo.entrypoints.openai.tool_calls.constraints import (
    calls_from_required_output,
    named_call_constraint,
    required_calls_constraint,
    required_calls_schema,
)
from octavo.entrypoints.openai.tool_calls.parsers import (
    TOOL_CALL_PARSERS,
    ParsedToolCall,
    hermes_safe_prefix,
    llama3_json_safe_prefix,
    parse_hermes,
    parse_llama3_json,
)
from octavo.entrypoints.openai.tool_calls.plan import ToolPlan
from octavo.entrypoints.openai.tool_calls.stream import ToolCallStream

WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}


def test_hermes_blocks_become_calls_and_the_rest_stays_content():
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    parsed = parse_hermes(text)
    assert parsed.content == "Let me check."
    assert parsed.calls == [
        ParsedToolCall("get_weather", '{"city": "Paris"}'),
        ParsedToolCall("get_time", "{}"),
    ]


@pytest.mark.parametrize(
    "text",
    ["Just text.", "<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>'],
)
def test_hermes_without_a_valid_block_is_all_content(text):
    parsed = parse_hermes(text)
    assert parsed.calls == [] and parsed.content == text


def test_llama3_json_single_and_several_calls():
    one = parse_llama3_json('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert one.content is None and one.calls == [ParsedToolCall("get_weather", '{"city": "Oslo"}')]
    first = '{"name": "get_time", "parameters": {"zone": "a;b"}}'
    two = parse_llama3_json(first + '; {"name": "get_time", "parameters": {}}')
    assert [call.arguments for call in two.calls] == ['{"zone": "a;b"}', "{}"]


@pytest.mark.parametrize("text", ["The weather is fine.", '{"city": "Oslo"}', "{broken"])
def test_llama3_json_that_is_not_a_call_is_content(text):
    parsed = parse_llama3_json(text)
    assert parsed.calls == [] and parsed.content == text


def test_required_schema_accepts_calls_to_the_tools_only():
    schema = required_calls_schema([WEATHER, TIME], parallel=True)
    good = [
        {"name": "get_weather", "parameters": {"city": "Rome"}},
        {"name": "get_time", "parameters": {}},
    ]
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "launch", "parameters": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, required_calls_schema([WEATHER, TIME], parallel=False))
    assert calls_from_required_output(json.dumps(good)) == [
        ParsedToolCall("get_weather", '{"city": "Rome"}'),
        ParsedToolCall("get_time", "{}"),
    ]


def test_named_call_constraint_is_the_parameters_schema():
    assert json.loads(named_call_constraint(WEATHER["parameters"]).json) == WEATHER["parameters"]
    assert json.loads(named_call_constraint(None).json) == {"type": "object"}


def test_constrained_tool_calls_from_a_tiny_model_are_valid_calls(tiny_folder):
    """The constraints compile and any model's output under them reads back as calls (the
    tools' arguments are bounded: a random model would fill a free string forever)."""
    from octavo import LLM, SamplingParams

    city = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    weather = {"name": "get_weather", "parameters": city}
    clock = {"name": "get_time", "parameters": {"type": "object", "additionalProperties": False}}
    llm = LLM(
        str(tiny_folder("qwen2")), dtype="float32", max_model_len=256, kv_cache_memory=16 << 20
    )
    required = required_calls_constraint([weather, clock], parallel=False)
    named = named_call_constraint(city)
    params = [
        SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=c)
        for c in (required, named)
    ]
    outputs = llm.generate(["Call a tool:", "Weather in"], params, use_tqdm=False)
    (call,) = calls_from_required_output(outputs[0].outputs[0].text)
    assert call.name in {"get_weather", "get_time"}
    jsonschema.validate(json.loads(outputs[1].outputs[0].text), city)


def test_auto_needs_the_server_flags():
    from octavo.entrypoints.openai.errors import APIError
    from octavo.entrypoints.openai.protocol import ChatCompletionRequest
    from octavo.entrypoints.openai.tool_calls.plan import plan_tools

    body = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": WEATHER}],
    )
    with pytest.raises(APIError, match="--enable-auto-tool-choice and --tool-call-parser"):
        plan_tools(body, False, None)
    plan = plan_tools(body, True, "llama3_json")
    assert plan.mode == "auto" and plan.read('{"name": "get_weather", "parameters": {}}').calls


def test_serve_refuses_auto_tool_choice_without_a_parser(capsys):
    from octavo.cli import main

    assert main(["serve", "--enable-auto-tool-choice"]) == 2
    assert "--enable-auto-tool-choice needs --tool-call-parser" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("", 0),
        ("Hello", 5),
        ("a < b", 5),  # a "<" that can no longer open a tag is content
        ("Hello <", 6),
        ("Hello <tool_ca", 6),  # may be the start of a tag: held back
        ("Hello <tool_call>", 6),
        ('Hi<tool_call>{"name": "f"}</tool_call> after', 2),
        ("<tool_call", 0),
        ("<tool_cal>", 10),  # not the tag after all
    ],
)
def test_hermes_safe_prefix(text, safe):
    assert hermes_safe_prefix(text) == safe


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("", 0),
        ("   ", 0),
        ("{", 0),
        ('  {"name": "f"', 0),
        ("<|python", 0),  # may be the start of <|python_tag|>
        ("<|python_tag|>{", 0),
        ("Hello {", 7),  # text first: never a llama3_json call
        ("<|pyx", 5),
    ],
)
def test_llama3_json_safe_prefix(text, safe):
    assert llama3_json_safe_prefix(text) == safe


HERMES_TEXT = (
    'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
)


@pytest.mark.parametrize("piece", [1, 2, 3, 7, len(HERMES_TEXT)])
@pytest.mark.parametrize("parallel", [True, False])
def test_auto_stream_sends_only_content_then_whole_calls(piece, parallel):
    """However the text is cut into deltas, the content streams without any part of a tag
    and the calls come at the end (only the first with ``parallel_tool_calls: false``)."""
    plan = ToolPlan("auto", [], None, parallel, TOOL_CALL_PARSERS["hermes"])
    stream = ToolCallStream(plan)
    deltas = [stream.delta(HERMES_TEXT[i : i + piece]) for i in range(0, len(HERMES_TEXT), piece)]
    content = "".join(delta.content for delta in deltas if delta is not None)
    finished = stream.finish()
    assert content == "Sure." and not any(delta.content for delta in finished)
    names = [delta.tool_calls[0].function.name for delta in finished]
    assert names == (["get_weather", "get_time"] if parallel else ["get_weather"])
    assert [delta.tool_calls[0].index for delta in finished] == list(range(len(names)))


def test_auto_keeps_only_the_first_call_without_parallel_tool_calls():
    parser = TOOL_CALL_PARSERS["hermes"]
    both = ToolPlan("auto", [], None, True, parser).read(HERMES_TEXT)
    first = ToolPlan("auto", [], None, False, parser).read(HERMES_TEXT)
    assert [call.name for call in both.calls] == ["get_weather", "get_time"]
    assert first.calls == both.calls[:1] and first.content == both.content == "Sure."
