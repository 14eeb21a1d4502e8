"""``--reasoning-parser`` (vLLM's ``qwen3`` and ``deepseek_r1``) and ``chat_template_kwargs``.

The parsers on canned replies, whole and streamed in every split (markers cut across
deltas included), then served: a tiny random Qwen2 whose chat template has Qwen3's
``enable_thinking`` switch and ``<think>``/``</think>`` tokens, its replies forced by a
regex, the streamed deltas joining into the whole reply's reasoning and content.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from octavo.entrypoints.openai.context import ServerConfig
from octavo.entrypoints.openai.reasoning.parsers import (
    REASONING_PARSERS,
    ReasoningStart,
    reasoning_start,
)
from octavo.entrypoints.openai.reasoning.plan import ReasoningPlan, plan_reasoning
from octavo.entrypoints.openai.reasoning.stream import ReasoningStream, split_reasoning

from server_harness import ThreadedServer, openai_client, served_model
from tiny_models import build_tiny_model

QWEN3 = REASONING_PARSERS["qwen3"]
R1 = REASONING_PARSERS["deepseek_r1"]
OPEN = ReasoningStart("reasoning")  # the reply starts inside the thinking
NEUTRAL_PROMPT = "<|im_start|>assistant\n"

# (parser, prompt tail, chat_template_kwargs, constrained, reply, reasoning, content)
CANNED = [
    # DeepSeek-R1: the template opened <think>, the reply has only </think>.
    (R1, "<|Assistant|><think>\n", {}, False, "I see.</think>Paris.", "I see.", "Paris."),
    (R1, NEUTRAL_PROMPT, {}, False, "<think>I see.</think>Paris.", "I see.", "Paris."),
    (R1, NEUTRAL_PROMPT, {}, False, "cut short before the end", "cut short before the end", None),
    (R1, NEUTRAL_PROMPT, {}, False, "all thought</think>", "all thought", None),
    # Qwen3: its own <think> block (leading whitespace before it is dropped).
    (QWEN3, NEUTRAL_PROMPT, {}, False, "\n<think>\nhm\n</think>\n\nHi", "\nhm\n", "\n\nHi"),
    (QWEN3, NEUTRAL_PROMPT, {}, False, "<think></think>Hi", None, "Hi"),
    # Qwen3 with thinking off: the template wrote an empty block, the reply is content...
    (
        QWEN3,
        "assistant\n<think>\n\n</think>\n\n",
        {"enable_thinking": False},
        False,
        "Hi <think> is text here",
        None,
        "Hi <think> is text here",
    ),
    # ... also where the template did not, and even if it never closes anything.
    (QWEN3, NEUTRAL_PROMPT, {"enable_thinking": False}, False, "Hi.", None, "Hi."),
    # A grammar from the first token: content, unless it writes the block itself.
    (QWEN3, NEUTRAL_PROMPT, {}, True, '{"a": 1}', None, '{"a": 1}'),
    (QWEN3, NEUTRAL_PROMPT, {}, True, "<think>x</think>{}", "x", "{}"),
    # Things that look like markers and are not.
    (QWEN3, NEUTRAL_PROMPT, {}, False, "<thinker>a</thinx>", "<thinker>a</thinx>", None),
    (QWEN3, NEUTRAL_PROMPT, {}, False, "<thi", "<thi", None),
    (R1, NEUTRAL_PROMPT, {}, False, "a</th", "a</th", None),
    (R1, NEUTRAL_PROMPT, {}, False, "", None, None),
]


def start_of(parser, tail, kwargs, constrained) -> ReasoningStart:
    return reasoning_start(parser, tail, kwargs, constrained)


@pytest.mark.parametrize(
    ("parser", "tail", "kwargs", "constrained", "reply", "reasoning", "content"), CANNED
)
def test_whole_replies_split_as_vllm_splits_them(
    parser, tail, kwargs, constrained, reply, reasoning, content
):
    piece = split_reasoning(reply, parser, start_of(parser, tail, kwargs, constrained))
    assert (piece.reasoning, piece.content) == (reasoning, content)


def streamed(reply: str, cuts: list[int], parser, start: ReasoningStart) -> list:
    """The pieces ``ReasoningStream`` sends for ``reply`` cut at ``cuts``."""
    stream = ReasoningStream(parser, start)
    bounds = [0, *cuts, len(reply)]
    pieces = [stream.feed(reply[a:b]) for a, b in itertools.pairwise(bounds)]
    return [*pieces, stream.finish()]


def every_split(reply: str) -> Iterator[list[int]]:
    """Character by character, every single cut, and every pair of cuts."""
    yield list(range(1, len(reply)))
    for one in range(len(reply) + 1):
        yield [one]
        for two in range(one, len(reply) + 1):
            yield [one, two]


@pytest.mark.parametrize(
    ("parser", "tail", "kwargs", "constrained", "reply", "reasoning", "content"), CANNED
)
def test_streamed_pieces_join_into_the_whole_reply(
    parser, tail, kwargs, constrained, reply, reasoning, content
):
    start = start_of(parser, tail, kwargs, constrained)
    for cuts in every_split(reply):
        pieces = streamed(reply, cuts, parser, start)
        assert "".join(p.reasoning or "" for p in pieces) == (reasoning or ""), cuts
        assert "".join(p.content or "" for p in pieces) == (content or ""), cuts


def test_a_marker_cut_across_deltas_is_held_back_not_sent():
    pieces = streamed("Let me see</think>Paris.", [12, 15], R1, OPEN)
    sent = [(p.reasoning, p.content) for p in pieces]
    assert sent == [("Let me see", None), (None, None), (None, "Paris."), (None, None)]
    opening = streamed("<think>x</think>y", [2, 4], QWEN3, ReasoningStart("reasoning"))
    assert [(p.reasoning, p.content) for p in opening][:2] == [(None, None), (None, None)]
    for piece in opening:
        assert "<" not in (piece.reasoning or "") + (piece.content or "")


def test_include_reasoning_false_drops_only_the_reasoning():
    plan = ReasoningPlan(QWEN3, OPEN, include=False)
    whole = plan.whole("hm</think>Hi")
    assert (whole.reasoning, whole.content) == (None, "Hi")
    assert plan.delta(0, "hm</think>H").reasoning is None
    assert plan.delta(0, "i").content == "i"


def test_without_a_parser_the_text_is_untouched():
    plan = ReasoningPlan()
    assert (plan.whole("<think>x</think>").reasoning, plan.whole("").content) == (None, "")
    assert plan.delta(0, "<think>").content == "<think>" and plan.finish(0).content == ""


# ----- a tokenizer and chat template with a thinking switch --------------------------------
TEMPLATE = """\
{%- if tools %}<|im_start|>system
Tools:{% for tool in tools %} {{ tool | tojson }}{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""
R1_TEMPLATE = """\
{%- for message in messages %}<|{{ message.role }}|>{{ message.content }}{% endfor %}
{%- if add_generation_prompt %}<|assistant|><think>
{% endif %}"""


@pytest.fixture(scope="module")
def thinking_tokenizer(smol_folder):
    tokenizer = AutoTokenizer.from_pretrained(smol_folder)
    tokenizer.add_tokens(["<think>", "</think>"])  # as in Qwen3: added, not special
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def rendered(tokenizer, template: str | None = None, **kwargs) -> list[int]:
    messages = [{"role": "user", "content": "Capital of France?"}]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=template, **kwargs
    )
    return tokenizer.encode(text, add_special_tokens=False)


def test_the_rendered_prompt_decides_where_the_reply_starts(thinking_tokenizer):
    tokenizer = thinking_tokenizer
    r1 = plan_reasoning("deepseek_r1", tokenizer, rendered(tokenizer, R1_TEMPLATE), {}, False)
    assert r1.start.mode == "reasoning"
    assert (r1.whole("I see.</think>Paris.").reasoning, r1.whole("x").content) == ("I see.", None)
    off = {"enable_thinking": False}
    qwen3_off = plan_reasoning("qwen3", tokenizer, rendered(tokenizer, **off), off, False)
    assert qwen3_off.start == ReasoningStart("content", look_for_start=False)
    assert qwen3_off.whole("<think>x</think>").content == "<think>x</think>"
    qwen3 = plan_reasoning("qwen3", tokenizer, rendered(tokenizer), {}, False)
    assert qwen3.start.mode == "reasoning" and qwen3.whole("x").reasoning == "x"


# ----- the flags -----------------------------------------------------------------------------
def test_an_unknown_parser_is_one_line_naming_the_supported_ones(capsys):
    from octavo.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--reasoning-parser", "deepseek"])
    assert stopped.value.code == 2
    assert "--reasoning-parser: 'deepseek' is not one of deepseek_r1, qwen3" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{bad", "not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"tools": []}', "may not set tools"),
    ],
)
def test_bad_default_chat_template_kwargs_are_refused(capsys, value, message):
    from octavo.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--default-chat-template-kwargs", value])
    assert message in capsys.readouterr().err


def test_the_flags_reach_the_server_config():
    from octavo.cli import build_parser
    from octavo.config import EngineArgs
    from octavo.entrypoints.openai.cli import server_config
    from octavo.entrypoints.openai.protocol import ChatCompletionRequest
    from octavo.entrypoints.openai.serving_chat import template_kwargs

    args = build_parser().parse_args(
        [
            "serve",
            "--reasoning-parser",
            "qwen3",
            "--default-chat-template-kwargs",
            '{"enable_thinking": false, "tone": "dry"}',
        ]
    )
    config = server_config(args, EngineArgs(model=None))
    assert config.reasoning_parser == "qwen3"
    body = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], chat_template_kwargs={"tone": "warm"}
    )
    assert template_kwargs(body, config) == {"enable_thinking": False, "tone": "warm"}


# ----- served ------------------------------------------------------------------------------
MODEL = "tiny-thinker"
ASK = [{"role": "user", "content": "Capital of France?"}]
THOUGHT = "\nThe capital of France is Paris.\n"
ANSWER = "\n\nParis."
SCRIPTED = f"<think>{THOUGHT}</think>{ANSWER}"
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory, thinking_tokenizer) -> Iterator[ThreadedServer]:
    folder = build_tiny_model(tmp_path_factory.mktemp("thinker"), "qwen2", thinking_tokenizer)
    config = ServerConfig(
        served_model_names=[MODEL],
        model_root=MODEL,
        reasoning_parser="qwen3",
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


def exactly(text: str) -> str:
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


def ask(client, stream: bool, forced: str | None = None, **extra):
    body = {"structured_outputs": {"regex": exactly(forced)}} if forced else {}
    return client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=extra.pop("max_tokens", 80),
        temperature=0,
        stream=stream,
        extra_body={**body, **extra.pop("extra_body", {})},
        **extra,
    )


def joined(stream) -> dict:
    """A streamed reply's parts put together, as a client does."""
    parts = {"reasoning_content": "", "reasoning": "", "content": "", "calls": [], "pieces": []}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            parts["pieces"].append(delta)
            for key in ("reasoning_content", "reasoning", "content"):
                parts[key] += delta.get(key) or ""
            parts["calls"] += choice.delta.tool_calls or []
    return parts


def test_the_thinking_goes_to_reasoning_content(client):
    message = ask(client, False, SCRIPTED).choices[0].message
    assert message.content == ANSWER
    assert message.reasoning_content == THOUGHT and message.reasoning == THOUGHT


def test_streamed_deltas_carry_the_reasoning_then_the_content(client):
    parts = joined(ask(client, True, SCRIPTED))
    assert parts["reasoning_content"] == parts["reasoning"] == THOUGHT
    assert parts["content"] == ANSWER
    texts = [(p.get("reasoning_content") or "") + (p.get("content") or "") for p in parts["pieces"]]
    assert not any("think>" in text for text in texts)
    kinds = [
        p.get("content") is not None
        for p in parts["pieces"]
        if p.get("content") or p.get("reasoning_content")
    ]
    assert kinds == sorted(kinds)  # reasoning first, then content, never back


def test_a_final_update_sends_its_logprobs_once(thinking_tokenizer):
    """The last update of an unclosed reply ending in a piece of ``</think>``: its new
    text and what was held back go out as two chunks, its logprobs with the first only."""
    from octavo.entrypoints.openai.logprobs_format import TokenDecoder
    from octavo.entrypoints.openai.protocol import ChatCompletionRequest
    from octavo.entrypoints.openai.serving_chat import ChatJob, _delta_choices
    from octavo.outputs import CompletionOutput
    from octavo.sampling.token_logprobs import TokenLogprobs

    body = ChatCompletionRequest(messages=ASK, logprobs=True, stream=True)
    job = ChatJob(body, "chatcmpl-1", MODEL, 3, TokenDecoder(thinking_tokenizer))
    job.reasoning = ReasoningPlan(QWEN3, OPEN)
    token = thinking_tokenizer.encode("ab</", add_special_tokens=False)[-1]
    output = CompletionOutput(
        0,
        "ab</",
        [token],
        "length",
        delta_text="ab</",
        delta_token_ids=[token],
        logprobs=[TokenLogprobs(token, -0.5, 1, [])],
    )
    choices = _delta_choices(job, output)
    sent = [(c.delta.reasoning_content, c.logprobs is not None) for c in choices]
    assert sent == [("ab", True), ("</", False)]
    assert choices[-1].finish_reason == "length"


def test_a_free_reply_streams_as_it_is_whole(client):
    """Unforced greedy text (a random model's, no ``</think>``: all reasoning for qwen3)."""
    whole = ask(client, False, max_tokens=12).choices[0].message
    parts = joined(ask(client, True, max_tokens=12))
    assert parts["reasoning_content"] == (whole.reasoning_content or "")
    assert parts["content"] == (whole.content or "")
    assert (whole.reasoning_content or "") + (whole.content or "")


def test_enable_thinking_false_reaches_the_template_and_the_parser(client):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    thinking = ask(client, False, "Paris.")
    plain = ask(client, False, "Paris.", extra_body=off)
    assert plain.usage.prompt_tokens > thinking.usage.prompt_tokens  # the empty block
    assert plain.choices[0].message.content == "Paris."
    assert getattr(plain.choices[0].message, "reasoning_content", None) is None
    free = ask(client, False, max_tokens=6, extra_body=off).choices[0].message
    assert free.content and getattr(free, "reasoning_content", None) is None


def test_include_reasoning_false_keeps_only_the_content(client):
    no = {"include_reasoning": False}
    message = ask(client, False, SCRIPTED, extra_body=no).choices[0].message
    assert (message.content, getattr(message, "reasoning_content", None)) == (ANSWER, None)
    parts = joined(ask(client, True, SCRIPTED, extra_body=no))
    assert (parts["content"], parts["reasoning_content"]) == (ANSWER, "")


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_read_from_the_content_only(client, stream):
    block = f"<tool_call>{json.dumps(CALL)}</tool_call>"
    forced = f"<think>maybe {block}?</think>{block}"
    reply = ask(client, stream, forced, tools=[WEATHER], max_tokens=120)
    if stream:
        parts = joined(reply)
        reasoning, calls = parts["reasoning_content"], parts["calls"]
        assert parts["content"] == ""
    else:
        message = reply.choices[0].message
        reasoning, calls = message.reasoning_content, message.tool_calls
        assert message.content is None and reply.choices[0].finish_reason == "tool_calls"
    assert reasoning == f"maybe {block}?"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (CALL["name"], CALL["arguments"])
    ]


@pytest.mark.parametrize("kwargs", ["no", ["enable_thinking"], 3])
def test_chat_template_kwargs_must_be_an_object(server, kwargs):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2, "chat_template_kwargs": kwargs}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "chat_template_kwargs"


def test_without_the_flag_replies_carry_no_reasoning_field():
    from octavo.entrypoints.openai.responses import AssistantMessage, DeltaMessage

    assert AssistantMessage.with_reasoning(None, content="x").model_dump() == {
        "role": "assistant",
        "content": "x",
        "tool_calls": [],
    }
    assert DeltaMessage(content="x").with_reasoning(None).model_dump() == {"content": "x"}
