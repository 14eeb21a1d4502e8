"""The reasoning parsers ``--reasoning-parser`` names, as vLLM names them.

Most read ``<think>`` ... ``</think>`` blocks; they differ in what a reply without
``</think>`` is:

- ``deepseek_r1`` (DeepSeek-R1 and its distills, QwQ): the template opens ``<think>`` in
  the prompt, so the output starts inside the thinking and has only ``</think>``; a reply
  that never closes it is all reasoning (it was cut short);
- ``minimax_m2`` (MiniMax-M2): the same (its template opens ``<think>`` too);
- ``qwen3`` (Qwen3): the same, but the template switch ``enable_thinking: false`` (in
  ``chat_template_kwargs``) means a reply without a think block is all content;
- ``glm45`` (GLM-4.5/4.6): the model opens ``<think>`` itself, so a reply that does not
  is all content (``enable_thinking: false`` makes the template write an empty block);
- ``granite`` (Granite 3.2/3.3): no tags but phrases, ``Here is my thought process:`` ...
  ``Here is my response:`` (``Here's`` too, as vLLM); a reply that does not open with
  the first is all content.

A reply that opens its thinking and never closes it is all reasoning (it was cut short).

Where the rendered prompt already settles it, the prompt wins (as vLLM's
``prompt_is_reasoning_end``): a prompt ending in ``</think>`` (Qwen3's template with
thinking off writes an empty block) makes the whole reply content, one ending in
``<think>`` makes it start inside the thinking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    start: str = THINK_START
    end: str = THINK_END
    thinking_switch: str | None = None  # a template kwarg that turns thinking off
    opens_in_prompt: bool = True  # False: the model writes ``start`` itself, else content
    other_starts: tuple[str, ...] = ()  # other spellings of ``start``
    other_ends: tuple[str, ...] = ()

    @property
    def starts(self) -> tuple[str, ...]:
        return (self.start, *self.other_starts)

    @property
    def ends(self) -> tuple[str, ...]:
        return (self.end, *self.other_ends)

    def thinking_enabled(self, template_kwargs: dict[str, Any]) -> bool:
        if self.thinking_switch is None:
            return True
        return template_kwargs.get(self.thinking_switch, True) is not False


GRANITE = ReasoningParser(
    "granite",
    start="Here is my thought process:",
    end="Here is my response:",
    opens_in_prompt=False,
    other_starts=("Here's my thought process:",),
    other_ends=("Here's my response:",),
)
REASONING_PARSERS: dict[str, ReasoningParser] = {
    "deepseek_r1": ReasoningParser("deepseek_r1"),
    "qwen3": ReasoningParser("qwen3", thinking_switch="enable_thinking"),
    "glm45": ReasoningParser("glm45", thinking_switch="enable_thinking", opens_in_prompt=False),
    "granite": GRANITE,
    "minimax_m2": ReasoningParser("minimax_m2"),
    # gpt-oss: Harmony replies are read by channel (harmony/choices.py), not by markers
    "openai_gptoss": ReasoningParser(
        "openai_gptoss", "<|channel|>analysis<|message|>", "<|end|>", opens_in_prompt=False
    ),
}
REASONING_PARSER_NAMES = tuple(REASONING_PARSERS)


@dataclass(frozen=True)
class ReasoningStart:
    """How a reply begins: ``mode`` ``reasoning`` or ``content``; ``look_for_start``: a
    ``<think>`` the reply itself opens with still switches it to reasoning."""

    mode: str
    look_for_start: bool = True


def reasoning_start(
    parser: ReasoningParser, prompt_tail: str, template_kwargs: dict[str, Any], constrained: bool
) -> ReasoningStart:
    """Where the reply starts, from the end of its rendered prompt and the request.

    ``constrained``: a grammar shapes the output from its first token (Octavo applies
    structured output to the whole reply), so it holds no thinking unless the grammar
    writes the ``<think>`` block itself."""
    tail = prompt_tail.rstrip()
    if tail.endswith(parser.ends):
        return ReasoningStart("content", look_for_start=False)
    if tail.endswith(parser.starts):
        return ReasoningStart("reasoning")
    if constrained or not parser.thinking_enabled(template_kwargs):
        return ReasoningStart("content")
    return ReasoningStart("reasoning" if parser.opens_in_prompt else "content")
