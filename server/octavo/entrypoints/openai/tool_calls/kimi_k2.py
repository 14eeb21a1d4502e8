"""``kimi_k2`` (Kimi K2): calls in a section, each named by an id ``functions.<name>:<n>``::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(the section's singular spelling, ``<|tool_call_section_begin|>``, is read too). The text
outside the section is the content.
"""

from __future__ import annotations

import re

from octavo.entrypoints.openai.tool_calls.blocks import Tags, read_section
from octavo.entrypoints.openai.tool_calls.calls import (
    ParsedToolCall,
    ToolCallParse,
    ToolCallParser,
    closed_through,
    marker_safe_prefix,
    normalized_arguments,
)

SECTION = Tags("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
SINGULAR_SECTION = Tags("<|tool_call_section_begin|>", "<|tool_call_section_end|>")
CALL = Tags("<|tool_call_begin|>", "<|tool_call_end|>")
ARGUMENTS = "<|tool_call_argument_begin|>"
CALL_ID = re.compile(r"(?:functions\.)?(?P<name>[^\s<>]+):\d+")


def read_kimi_k2_call(body: str) -> ParsedToolCall | None:
    call_id, found, arguments = body.partition(ARGUMENTS)
    match = CALL_ID.fullmatch(call_id.strip())
    if not found or match is None:
        return None
    return ParsedToolCall(match["name"], normalized_arguments(arguments))


def parse_kimi_k2(text: str) -> ToolCallParse:
    plural = text.replace(SINGULAR_SECTION.open, SECTION.open).replace(
        SINGULAR_SECTION.close, SECTION.close
    )
    parsed = read_section(plural, SECTION, CALL, read_kimi_k2_call)
    return parsed if parsed.calls else ToolCallParse(text or None)


def kimi_k2_safe_prefix(text: str) -> int:
    return marker_safe_prefix(text, (SECTION.open, SINGULAR_SECTION.open))


KIMI_K2 = ToolCallParser(
    parse_kimi_k2,
    kimi_k2_safe_prefix,
    f"{SECTION.open}{CALL.open}functions.<function name>:<call number>{ARGUMENTS}"
    f"<arguments object>{CALL.close}{SECTION.close}",
    settled=closed_through(CALL.close),
)
