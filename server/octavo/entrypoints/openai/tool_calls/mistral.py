"""``mistral``: Mistral's ``[TOOL_CALLS]``, in both of its tokenizers' forms.

- before v11: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``, one JSON array;
- v11 and later: ``[TOOL_CALLS]name[ARGS]{...}`` (``[ARGS]`` is absent from some
  templates), once per call.

The text before the first ``[TOOL_CALLS]`` is the content. As in vLLM, a v11 call whose
arguments do not parse is still a call (the model did try to make it).
"""

from __future__ import annotations

import json

from octavo.entrypoints.openai.tool_calls.calls import (
    ParsedToolCall,
    ToolCallParse,
    ToolCallParser,
    arguments_text,
    joined_content,
    marker_safe_prefix,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"


def parse_mistral(text: str) -> ToolCallParse:
    before, found, rest = text.partition(TOOL_CALLS)
    if not found:
        return ToolCallParse(text or None)
    if rest.lstrip().startswith("["):
        calls, after = _array_calls(rest.lstrip())
    else:
        calls, after = _named_calls(rest.split(TOOL_CALLS))
    if not calls:
        return ToolCallParse(text or None)
    return ToolCallParse(joined_content([before, after]), calls)


def _array_calls(body: str) -> tuple[list[ParsedToolCall], str]:
    try:
        items, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError:
        return [], ""
    if not isinstance(items, list) or not all(_is_call(item) for item in items):
        return [], ""
    calls = [
        ParsedToolCall(item["name"], arguments_text(item.get("arguments", {}))) for item in items
    ]
    return calls, body[end:]


def _is_call(item: object) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str)


def _named_calls(pieces: list[str]) -> tuple[list[ParsedToolCall], str]:
    """``name[ARGS]{...}`` pieces; text after a call's arguments is content."""
    calls, after = [], ""
    for piece in pieces:
        brace = piece.find("{")
        name = piece[:brace].replace(ARGS, "").strip() if brace >= 0 else ""
        if not name:
            continue
        arguments, rest = _leading_object(piece[brace:])
        calls.append(ParsedToolCall(name, arguments))
        after += rest
    return calls, after


def _leading_object(text: str) -> tuple[str, str]:
    """The JSON object ``text`` starts with, re-written, and what follows it; text that
    does not parse is all arguments."""
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return text.strip(), ""
    return arguments_text(value), text[end:]


def mistral_settled(text: str) -> int:
    """v11 calls have no closing tag: those before the last ``[TOOL_CALLS]`` are done."""
    first, last = text.find(TOOL_CALLS), text.rfind(TOOL_CALLS)
    return last if last > first else 0


def mistral_safe_prefix(text: str) -> int:
    return marker_safe_prefix(text, (TOOL_CALLS,))


MISTRAL = ToolCallParser(
    parse_mistral,
    mistral_safe_prefix,
    '[TOOL_CALLS][{"name": <function name>, "arguments": <arguments object>}]',
    settled=mistral_settled,
)
