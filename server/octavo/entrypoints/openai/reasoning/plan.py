"""What one chat request's reasoning parser does to its choices' text, whole or streamed.

Without ``--reasoning-parser`` the text is all content, untouched. With one, each choice
is split into reasoning and content (``stream.py``); ``include_reasoning: false`` (vLLM's
request field) drops the reasoning and keeps the content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo.entrypoints.openai.reasoning.parsers import (
    REASONING_PARSERS,
    ReasoningParser,
    ReasoningStart,
    reasoning_start,
)
from octavo.entrypoints.openai.reasoning.stream import (
    ReasoningPiece,
    ReasoningStream,
    split_reasoning,
)

PROMPT_TAIL_TOKENS = 16  # enough to see a <think> or </think> the template ended with
ALL_CONTENT = ReasoningStart("content")


@dataclass(frozen=True)
class Split:
    reasoning: str | None  # None: no reasoning to send
    content: str | None  # whole replies: None when there is none; deltas: "" then


@dataclass
class ReasoningPlan:
    parser: ReasoningParser | None = None  # None: no --reasoning-parser
    start: ReasoningStart = ALL_CONTENT
    include: bool = True
    streams: dict[int, ReasoningStream] = field(default_factory=dict)

    def whole(self, text: str) -> Split:
        """A finished reply's two parts."""
        if self.parser is None:
            return Split(None, text)
        piece = split_reasoning(text, self.parser, self.start)
        return Split(self._shown(piece.reasoning), piece.content)

    def delta(self, index: int, text: str) -> Split:
        """What choice ``index``'s new ``text`` adds to each part."""
        if self.parser is None:
            return Split(None, text)
        return self._split(self._stream(index).feed(text))

    def finish(self, index: int) -> Split:
        """What choice ``index`` held back, once it has finished."""
        if self.parser is None:
            return Split(None, "")
        return self._split(self._stream(index).finish())

    def _stream(self, index: int) -> ReasoningStream:
        if index not in self.streams:
            assert self.parser is not None
            self.streams[index] = ReasoningStream(self.parser, self.start)
        return self.streams[index]

    def _split(self, piece: ReasoningPiece) -> Split:
        return Split(self._shown(piece.reasoning), piece.content or "")

    def _shown(self, reasoning: str | None) -> str | None:
        return reasoning if self.include else None


def plan_reasoning(
    parser_name: str | None,
    tokenizer: Any,
    prompt_token_ids: list[int],
    template_kwargs: dict[str, Any],
    constrained: bool,
    include: bool = True,
) -> ReasoningPlan:
    """The request's plan: where its replies start, read off the rendered prompt's end."""
    if parser_name is None:
        return ReasoningPlan()
    parser = REASONING_PARSERS[parser_name]
    tail = tokenizer.decode(prompt_token_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    start = reasoning_start(parser, tail, template_kwargs, constrained)
    return ReasoningPlan(parser, start, include)
