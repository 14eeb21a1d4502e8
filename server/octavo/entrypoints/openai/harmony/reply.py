"""A whole Harmony reply as the chat message's parts, and the ``openai`` tool-call parser
(vLLM's name) over it."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.entrypoints.openai.harmony.text_stream import HarmonyPiece, read_pieces
from octavo.entrypoints.openai.tool_calls.calls import (
    ParsedToolCall,
    ToolCallParse,
    ToolCallParser,
)


@dataclass
class HarmonyReply:
    reasoning: str | None = None  # the analysis channel (None: none)
    content: str | None = None  # final, and commentary preambles (None: none)
    calls: list[ParsedToolCall] = field(default_factory=list)

    @classmethod
    def of(cls, pieces: list[HarmonyPiece]) -> HarmonyReply:
        """The pieces of a reply joined: each kind's text, each call message one call."""
        reasoning = "".join(piece.text for piece in pieces if piece.kind == "reasoning")
        content = "".join(piece.text for piece in pieces if piece.kind == "content")
        arguments: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        for piece in pieces:
            if piece.kind == "call":
                arguments.setdefault(piece.message, []).append(piece.text)
                names[piece.message] = piece.function or ""
        calls = [
            ParsedToolCall(names[message], "".join(texts)) for message, texts in arguments.items()
        ]
        return cls(reasoning or None, content or None, calls)


def read_reply(text: str) -> HarmonyReply:
    """A finished reply's text (its special tokens kept) as its parts."""
    return HarmonyReply.of(read_pieces(text))


def parse_openai(text: str) -> ToolCallParse:
    """``--tool-call-parser openai``: the calls and the final content of a Harmony reply
    (its reasoning is ``--reasoning-parser openai_gptoss``'s; on the chat path the Harmony
    reader splits a reply into all three at once: ``choices.py``)."""
    reply = read_reply(text)
    return ToolCallParse(reply.content, reply.calls)


def _nothing_safe(text: str) -> int:
    """Harmony replies are read by their own stream (``choices.py``), never piecewise."""
    return 0


OPENAI = ToolCallParser(
    parse_openai,
    _nothing_safe,
    "<|start|>assistant<|channel|>commentary to=functions.<function name> "
    "<|constrain|>json<|message|><arguments object><|call|>",
)
