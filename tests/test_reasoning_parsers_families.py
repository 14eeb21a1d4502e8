"""The 2025 families' ``--reasoning-parser``s (vLLM's ``glm45``, ``granite``,
``minimax_m2``) on the exact text each family emits after its template's prompt: read
whole, and streamed split at every character boundary, one character at a time and in
random chunkings, the pieces always joining into the whole reply's reasoning and content."""

from __future__ import annotations

import argparse

import pytest

from chunkings import chunkings
from octavo.entrypoints.openai.reasoning.parsers import REASONING_PARSERS, reasoning_start
from octavo.entrypoints.openai.reasoning.stream import ReasoningStream, split_reasoning

GLM_PROMPT = "[gMASK]<sop><|user|>\nHi<|assistant|>"
GLM_NO_THINKING = GLM_PROMPT + "\n<think></think>\n"
GRANITE_PROMPT = "<|start_of_role|>assistant<|end_of_role|>"
MINIMAX_PROMPT = "]~b]user\nHi[e~[\n]~b]ai\n<think>\n"
THOUGHT = "Here is my thought process:\nThe user greets.\n"

# (parser, prompt tail, chat_template_kwargs, reply, reasoning, content)
CASES = [
    (
        "glm45",
        GLM_PROMPT,
        {},
        "\n<think>The user greets.</think>\nHello!",
        "The user greets.",
        "\nHello!",
    ),
    ("glm45", GLM_PROMPT, {}, "Hello, no thinking.", None, "Hello, no thinking."),
    ("glm45", GLM_PROMPT, {}, "<think>cut short", "cut short", None),
    (
        "glm45",
        GLM_NO_THINKING,
        {"enable_thinking": False},
        "Hi <think>x</think>",
        None,
        "Hi <think>x</think>",
    ),
    ("glm45", GLM_PROMPT, {"enable_thinking": False}, "Hello!", None, "Hello!"),
    (
        "granite",
        GRANITE_PROMPT,
        {},
        THOUGHT + "Here is my response:\nHello!",
        "\nThe user greets.\n",
        "\nHello!",
    ),
    (
        "granite",
        GRANITE_PROMPT,
        {},
        "Here's my thought process: a Here's my response: b",
        " a ",
        " b",
    ),
    (
        "granite",
        GRANITE_PROMPT,
        {},
        "Here is a plain answer: hello.",
        None,
        "Here is a plain answer: hello.",
    ),
    (
        "granite",
        GRANITE_PROMPT,
        {},
        THOUGHT + "Here is my respo",
        THOUGHT[27:] + "Here is my respo",
        None,
    ),
    (
        "minimax_m2",
        MINIMAX_PROMPT,
        {},
        "The user greets.\n</think>\n\nHello!",
        "The user greets.\n",
        "\n\nHello!",
    ),
    ("minimax_m2", MINIMAX_PROMPT, {}, "still thinking", "still thinking", None),
]


def streamed(stream: ReasoningStream, pieces: list[str]) -> tuple[str | None, str | None]:
    outs = [stream.feed(piece) for piece in pieces] + [stream.finish()]
    reasoning = "".join(out.reasoning or "" for out in outs)
    content = "".join(out.content or "" for out in outs)
    return reasoning or None, content or None


@pytest.mark.parametrize(("name", "prompt", "kwargs", "reply", "reasoning", "content"), CASES)
def test_whole_and_streamed_replies_split_the_same(name, prompt, kwargs, reply, reasoning, content):
    parser = REASONING_PARSERS[name]
    start = reasoning_start(parser, prompt, kwargs, constrained=False)
    whole = split_reasoning(reply, parser, start)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    for pieces in chunkings(reply):
        assert streamed(ReasoningStream(parser, start), pieces) == (reasoning, content), pieces


def test_what_is_streamed_so_far_is_always_a_prefix_of_the_whole():
    """No piece of a marker goes out and is later taken back: each part only grows."""
    for name, prompt, kwargs, reply, reasoning, content in CASES:
        parser = REASONING_PARSERS[name]
        stream = ReasoningStream(parser, reasoning_start(parser, prompt, kwargs, False))
        sent_reasoning = sent_content = ""
        for char in reply:
            out = stream.feed(char)
            sent_reasoning += out.reasoning or ""
            sent_content += out.content or ""
            assert (reasoning or "").startswith(sent_reasoning)
            assert (content or "").startswith(sent_content)


def test_granite_needs_both_phrases_and_the_first_at_the_start():
    granite = REASONING_PARSERS["granite"]
    start = reasoning_start(granite, GRANITE_PROMPT, {}, constrained=False)
    assert start.mode == "content"  # no phrase, no reasoning
    later = "Sure. Here is my thought process: x Here is my response: y"
    assert split_reasoning(later, granite, start).reasoning is None


def test_the_prompt_decides_where_glm_and_minimax_replies_start():
    glm, minimax = REASONING_PARSERS["glm45"], REASONING_PARSERS["minimax_m2"]
    assert reasoning_start(glm, GLM_NO_THINKING, {}, False).mode == "content"
    assert reasoning_start(glm, GLM_PROMPT + "<think>", {}, False).mode == "reasoning"
    assert reasoning_start(minimax, MINIMAX_PROMPT, {}, False).mode == "reasoning"
    assert reasoning_start(minimax, "]~b]ai\n", {}, True).mode == "content"  # a grammar


def test_the_cli_accepts_and_lists_every_parser():
    from octavo.entrypoints.openai.options import SERVER_OPTIONS

    option = next(o for o in SERVER_OPTIONS if o.flag == "--reasoning-parser")
    for name in ("glm45", "granite", "minimax_m2"):
        assert option.type(name) == name and name in option.help
    with pytest.raises(argparse.ArgumentTypeError, match="minimax_m2"):
        option.type("minimax")
