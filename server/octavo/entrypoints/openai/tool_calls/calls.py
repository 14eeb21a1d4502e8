"""What every tool-call parser shares: the parsed call, the parse, the parser's interface,
and the streaming and content rules the parsers have in common."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

FunctionSchemas = Mapping[str, dict[str, Any]]  # function name -> its ``parameters`` schema
NO_SCHEMAS: FunctionSchemas = {}


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's ``function.arguments``)


@dataclass
class ToolCallParse:
    content: str | None
    calls: list[ParsedToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ToolCallParser:
    """``parse`` reads a whole reply; ``safe_prefix`` says how much of a streamed reply is
    surely content (the rest is parsed once the reply ends). ``typed_parse``: parsers whose
    call format writes values as bare text read their types off the tools' schemas.
    ``settled``: where a call ends with a closing tag, the text up to the last one holds
    the same calls whatever follows, so they can be sent before the reply ends."""

    parse: Callable[[str], ToolCallParse]
    safe_prefix: Callable[[str], int]  # streaming: characters that can go out as content
    call_format: str  # how a call is written, for the fallback tool prompt (tool_prompt.py)
    typed_parse: Callable[[str, FunctionSchemas], ToolCallParse] | None = None
    settled: Callable[[str], int] | None = None  # streaming: the end of the last closed call

    def read(self, text: str, schemas: FunctionSchemas = NO_SCHEMAS) -> ToolCallParse:
        if self.typed_parse is not None:
            return self.typed_parse(text, schemas)
        return self.parse(text)


def marker_safe_prefix(text: str, markers: tuple[str, ...]) -> int:
    """Up to the first of ``markers``, and never a tail that may be the start of one."""
    found = [at for at in (text.find(marker) for marker in markers) if at >= 0]
    if found:
        return min(found)
    held = max((_marker_prefix_length(text, marker) for marker in markers), default=0)
    return len(text) - held


def _marker_prefix_length(text: str, marker: str) -> int:
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def closed_through(close: str) -> Callable[[str], int]:
    """``settled`` for calls that end with ``close``: just after the last one."""

    def settled(text: str) -> int:
        at = text.rfind(close)
        return at + len(close) if at >= 0 else 0

    return settled


def joined_content(pieces: list[str]) -> str | None:
    """The text around calls as the message's content: what came before the first call as
    written, later pieces only where they hold more than whitespace (so a streamed reply,
    whose first piece went out as it came, joins into the same content)."""
    content = pieces[0] + "".join(piece for piece in pieces[1:] if piece.strip())
    return content or None


def arguments_text(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False)


def normalized_arguments(text: str) -> str:
    """A call's arguments as JSON text: re-written when they parse, as written when not
    (as vLLM: the client sees the call the model tried to make)."""
    try:
        return arguments_text(json.loads(text))
    except json.JSONDecodeError:
        return text.strip()
