"""Splitting a reply into its reasoning and its content, streamed or whole.

One state machine serves both, so a streamed reply's pieces always join into the whole
reply's two parts. A piece of a marker split across deltas (``</thi`` then ``nk>``) is
held back until it is known to be one or not; the markers themselves are never sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.entrypoints.openai.reasoning.parsers import ReasoningParser, ReasoningStart


@dataclass(frozen=True)
class ReasoningPiece:
    reasoning: str | None = None
    content: str | None = None

    @classmethod
    def of(cls, reasoning: str, content: str) -> ReasoningPiece:
        return cls(reasoning or None, content or None)


class ReasoningStream:
    """``feed`` each new text, then ``finish``; each returns what can go out now."""

    def __init__(self, parser: ReasoningParser, start: ReasoningStart) -> None:
        self.parser = parser
        self.default_mode = start.mode
        self.mode = "opening" if start.look_for_start else start.mode
        self.pending = ""  # text held back: maybe the start of a marker

    def feed(self, text: str) -> ReasoningPiece:
        buffer, self.pending = self.pending + text, ""
        if self.mode == "opening":
            return self._opening(buffer)
        if self.mode == "reasoning":
            return self._reasoning(buffer)
        return ReasoningPiece.of("", buffer)

    def finish(self) -> ReasoningPiece:
        """What was held back, once the reply has ended (an unfinished marker is text)."""
        rest, self.pending = self.pending, ""
        mode = self.default_mode if self.mode == "opening" else self.mode
        self.mode = mode
        return ReasoningPiece.of(rest, "") if mode == "reasoning" else ReasoningPiece.of("", rest)

    def _opening(self, buffer: str) -> ReasoningPiece:
        """Before the reply's first words: does it open with ``<think>``?"""
        head = buffer.lstrip()
        starts = self.parser.starts
        if any(len(head) < len(start) and start.startswith(head) for start in starts):
            self.pending = buffer  # maybe ``<think>``, maybe not: wait
            return ReasoningPiece()
        start = next((start for start in starts if head.startswith(start)), None)
        if start is not None:
            self.mode = "reasoning"
            return self._reasoning(head[len(start) :])
        self.mode = self.default_mode
        return self.feed(buffer)

    def _reasoning(self, buffer: str) -> ReasoningPiece:
        found = [(at, end) for end in self.parser.ends if (at := buffer.find(end)) >= 0]
        if found:
            at, end = min(found)
            self.mode = "content"
            return ReasoningPiece.of(buffer[:at], buffer[at + len(end) :])
        keep = max(_marker_prefix_length(buffer, end) for end in self.parser.ends)
        self.pending = buffer[len(buffer) - keep :]
        return ReasoningPiece.of(buffer[: len(buffer) - keep], "")


def _marker_prefix_length(text: str, marker: str) -> int:
    """The longest end of ``text`` that is the beginning of ``marker`` (0 if none)."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def split_reasoning(text: str, parser: ReasoningParser, start: ReasoningStart) -> ReasoningPiece:
    """A whole reply's reasoning and content (what its streamed pieces join into)."""
    stream = ReasoningStream(parser, start)
    first, last = stream.feed(text), stream.finish()
    reasoning = (first.reasoning or "") + (last.reasoning or "")
    content = (first.content or "") + (last.content or "")
    return ReasoningPiece.of(reasoning, content)
