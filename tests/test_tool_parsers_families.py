"""The 2025 families' ``--tool-call-parser``s (vLLM's names) on the exact text each family
emits: read whole, and streamed split at every character boundary, one character at a
time and in random chunkings, the streamed content and calls always those of the whole
reply (content before and after the calls kept)."""

from __future__ import annotations

import argparse
import json
import random

import pytest

from chunkings import chunkings
from octavo.entrypoints.openai.tool_calls.parsers import TOOL_CALL_PARSERS, ToolCallParse
from octavo.entrypoints.openai.tool_calls.plan import ToolPlan
from octavo.entrypoints.openai.tool_calls.stream import ToolCallStream


def tool(name: str, properties: dict) -> dict:
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOLS = [
    tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}),
    tool(
        "search",
        {
            "query": {"type": "string"},
            "limit": {"type": "number"},
            "exact": {"type": "boolean"},
            "filters": {"type": "object"},
            "tags": {"type": "array"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    ),
]
WEATHER = ("get_weather", {"city": "Paris", "days": 3})
TIME = ("get_time", {})

DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{}\n```json\n{}\n```<｜tool▁call▁end｜>"
KIMI_CALL = "<|tool_call_begin|>functions.{}:{}<|tool_call_argument_begin|>{}<|tool_call_end|>"

# (parser, the model's text, the content, the calls as (name, arguments))
CASES = [
    (
        "mistral",
        'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": 3}}, {"name": "get_time", "arguments": {}}]',
        "Checking.",
        [WEATHER, TIME],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]get_time[ARGS]{}',
        None,
        [WEATHER, TIME],
    ),
    ("mistral", "Sure [TOOL_CALLS]get_time{} and more", "Sure  and more", [TIME]),
    (
        "pythonic",
        '[get_weather(city="Paris", days=3), get_time()]',
        None,
        [WEATHER, TIME],
    ),
    (
        "pythonic",
        "<|python_start|>[get_weather(city='Paris', days=3)]<|python_end|>",
        None,
        [WEATHER],
    ),
    (
        "deepseek_v3",
        "Let me look.\n<｜tool▁calls▁begin｜>"
        + DS_CALL.format("get_weather", '{"city": "Paris", "days": 3}')
        + "\n"
        + DS_CALL.format("get_time", "{}")
        + "<｜tool▁calls▁end｜>Done.",
        "Let me look.\nDone.",
        [WEATHER, TIME],
    ),
    (
        "qwen3_coder",
        "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\nAfter.",
        "I will check.\n\nAfter.",
        [WEATHER, TIME],
    ),
    (
        "qwen3_coder",
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3"
        "\n</parameter>\n</function>",
        None,
        [WEATHER],
    ),
    (
        "glm45",
        "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
        "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n"
        "<tool_call>get_time\n</tool_call>",
        "Checking.\n",
        [WEATHER, TIME],
    ),
    (
        "kimi_k2",
        "Let me check. <|tool_calls_section_begin|>"
        + KIMI_CALL.format("get_weather", 0, '{"city": "Paris", "days": 3}')
        + KIMI_CALL.format("get_time", 1, "{}")
        + "<|tool_calls_section_end|>",
        "Let me check. ",
        [WEATHER, TIME],
    ),
    (
        "kimi_k2",
        "<|tool_call_section_begin|>"
        + KIMI_CALL.format("get_time", 0, "{}")
        + "<|tool_call_section_end|>",
        None,
        [TIME],
    ),
]
NO_CALLS = [
    ("mistral", "No calls here, [TOOL_CALL] is not the token."),
    ("mistral", "[TOOL_CALLS] [not json"),
    ("pythonic", "[1, 2, 3]"),
    ("pythonic", '[get_weather(city=__import__("os").getcwd())]'),
    ("pythonic", "[get_weather('Paris')]"),
    ("pythonic", "Sure: [get_weather(city='Paris')]"),
    ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_wea"),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"),
    ("qwen3_coder", "<tool_call>{not a function}</tool_call>"),
    ("glm45", "<tool_call>\n</tool_call> and text"),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>no id<|tool_call_end|>"),
]


def auto_plan(name: str) -> ToolPlan:
    return ToolPlan("auto", TOOLS, None, True, TOOL_CALL_PARSERS[name])


def call_pairs(parse: ToolCallParse) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in parse.calls]


def streamed(name: str, pieces: list[str]) -> tuple[str | None, list[tuple[str, dict]]]:
    """The content and calls a client of the stream would put together."""
    stream = ToolCallStream(auto_plan(name))
    deltas = [stream.delta(piece) for piece in pieces] + stream.finish()
    deltas = [delta for delta in deltas if delta is not None]
    content = "".join(delta.content or "" for delta in deltas) or None
    calls = [
        (call.function.name, json.loads(call.function.arguments))
        for delta in deltas
        for call in delta.tool_calls or []
    ]
    return content, calls


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_whole_and_streamed_replies_give_the_same_content_and_calls(name, text, content, calls):
    whole = auto_plan(name).read(text)
    assert whole.content == content and call_pairs(whole) == calls
    for pieces in chunkings(text):
        assert streamed(name, pieces) == (content, calls), pieces


@pytest.mark.parametrize(("name", "text"), NO_CALLS)
def test_text_that_is_not_a_call_stays_content_as_written(name, text):
    whole = auto_plan(name).read(text)
    assert whole.calls == [] and whole.content == text
    for pieces in (list(text), [text[:5], text[5:]]):
        assert streamed(name, pieces) == (text, [])


@pytest.mark.parametrize("name", sorted({case[0] for case in CASES}))
def test_spliced_replies_stream_as_they_read_whole(name):
    """Two of the family's texts cut and joined at random (markers and blocks broken, calls
    after broken ones, stray closing tags): streamed a character at a time, the same."""
    pool = [case[1] for case in CASES + NO_CALLS if case[0] == name]
    rng = random.Random(name)
    for _ in range(40):
        first, second = rng.choice(pool), rng.choice(pool)
        text = first[: rng.randrange(len(first) + 1)] + second[rng.randrange(len(second) + 1) :]
        whole = auto_plan(name).read(text)
        try:
            expected = (whole.content, call_pairs(whole))
        except json.JSONDecodeError:  # a cut argument object: a call, but not JSON
            continue
        assert streamed(name, list(text)) == expected, text


def test_no_markup_of_a_call_is_ever_streamed_as_content():
    """Content goes out only up to where a call may begin (a marker cut across deltas too)."""
    for name, text, content, _ in CASES:
        stream = ToolCallStream(auto_plan(name))
        early = "".join((stream.delta(char) or _Empty()).content or "" for char in text)
        assert (content or "").startswith(early)


class _Empty:
    content = None


@pytest.mark.parametrize(
    ("name", "closing"),
    [
        ("mistral", "}[TOOL_CALLS]"),  # v11: the next call's marker ends the first
        ("deepseek_v3", "<｜tool▁call▁end｜>"),
        ("qwen3_coder", "</tool_call>"),
        ("glm45", "</tool_call>"),
        ("kimi_k2", "<|tool_call_end|>"),
    ],
)
def test_a_call_is_sent_as_soon_as_it_is_closed(name, closing):
    """Streamed, the first call goes out on the character that closes it, not at the end."""
    text = next(case[1] for case in CASES if case[0] == name and closing in case[1])
    closed_at = text.index(closing) + len(closing)
    stream = ToolCallStream(auto_plan(name))
    deltas = [stream.delta(char) for char in text]
    first = next(i for i, delta in enumerate(deltas, start=1) if delta and delta.tool_calls)
    (call,) = deltas[first - 1].tool_calls
    assert first == closed_at < len(text) and call.function.name == "get_weather"
    assert call.index == 0 and call.id.startswith("call_")


def test_qwen3_coder_values_are_typed_by_the_schema_as_vllm_does():
    text = (
        "<tool_call>\n<function=search>\n<parameter=query>\n42\n</parameter>\n"
        "<parameter=limit>\n2.5\n</parameter>\n<parameter=exact>\nTrue\n</parameter>\n"
        '<parameter=filters>\n{"lang": "en"}\n</parameter>\n'
        "<parameter=tags>\n['a', 'b']\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
        "<parameter=extra>\nline one\nline two\n</parameter>\n</function>\n</tool_call>"
    )
    (call,) = call_pairs(auto_plan("qwen3_coder").read(text))
    assert call == (
        "search",
        {
            "query": "42",
            "limit": 2.5,
            "exact": True,
            "filters": {"lang": "en"},
            "tags": ["a", "b"],
            "note": None,
            "extra": "line one\nline two",
        },
    )


def test_qwen3_coder_and_glm45_without_tools_keep_values_as_written():
    qwen = TOOL_CALL_PARSERS["qwen3_coder"].read(
        "<tool_call><function=f><parameter=n>\n3\n</parameter></function></tool_call>"
    )
    assert call_pairs(qwen) == [("f", {"n": "3"})]
    glm = TOOL_CALL_PARSERS["glm45"].read(
        "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    )
    assert call_pairs(glm) == [("f", {"n": 3})]  # not declared a string: read as JSON


def test_glm45_strings_are_kept_and_other_values_read_as_json_or_python():
    text = (
        "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value> 007 </arg_value>\n"
        "<arg_key>tags</arg_key>\n<arg_value>['x', 'y']</arg_value>\n"
        '<arg_key>filters</arg_key>\n<arg_value>{"a": [1, 2]}</arg_value>\n'
        "<arg_key>exact</arg_key>\n<arg_value>true</arg_value>\n</tool_call>"
    )
    (call,) = call_pairs(auto_plan("glm45").read(text))
    assert call == (
        "search",
        {"query": " 007 ", "tags": ["x", "y"], "filters": {"a": [1, 2]}, "exact": True},
    )


def test_pythonic_reads_python_and_json_literals_without_eval():
    text = (
        "[search(query='a \"b\"', limit=-2, exact=true, note=None, "
        "filters={'k': [1, (2, 3)]}, tags=[])]"
    )
    (call,) = call_pairs(auto_plan("pythonic").read(text))
    assert call == (
        "search",
        {
            "query": 'a "b"',
            "limit": -2,
            "exact": True,
            "note": None,
            "filters": {"k": [1, [2, 3]]},
            "tags": [],
        },
    )


def test_mistral_v11_arguments_that_do_not_parse_are_still_a_call():
    parsed = auto_plan("mistral").read('[TOOL_CALLS]get_weather[ARGS]{"city": "Par')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Par')]


def test_deepseek_v3_markers_are_the_full_width_characters():
    begin = TOOL_CALL_PARSERS["deepseek_v3"].call_format
    assert "\uff5ctool\u2581calls\u2581begin\uff5c" in begin
    ascii_spelling = "<|tool_calls_begin|>" + DS_CALL.format("get_time", "{}")
    assert auto_plan("deepseek_v3").read(ascii_spelling).calls == []


def test_kimi_k2_names_keep_their_dots_and_drop_the_functions_prefix():
    text = "<|tool_calls_section_begin|>" + KIMI_CALL.format("ns.tool", 3, "{}")
    assert call_pairs(auto_plan("kimi_k2").read(text)) == [("ns.tool", {})]


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = next(case[1] for case in CASES if case[0] == "qwen3_coder" and len(case[3]) == 2)
    plan = ToolPlan("auto", TOOLS, None, False, TOOL_CALL_PARSERS["qwen3_coder"])
    assert [call.name for call in plan.read(text).calls] == ["get_weather"]


def test_the_cli_accepts_and_lists_every_parser():
    from octavo.entrypoints.openai.options import SERVER_OPTIONS

    option = next(o for o in SERVER_OPTIONS if o.flag == "--tool-call-parser")
    names = ("mistral", "pythonic", "deepseek_v3", "qwen3_coder", "glm45", "kimi_k2")
    for name in names:
        assert option.type(name) == name and name in option.help
    with pytest.raises(argparse.ArgumentTypeError, match="kimi_k2"):
        option.type("kimi")
