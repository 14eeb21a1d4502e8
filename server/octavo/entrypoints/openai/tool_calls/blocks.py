"""Calls written as tagged blocks (``<open>`` body ``<close>``), optionally inside a
section (DeepSeek's and Kimi's ``calls begin`` ... ``calls end``).

A block whose body does not read as a call stays in the content as written, and so does
a block the reply never closed (it was cut short): the client sees what the model wrote
rather than a call that was never made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from octavo.entrypoints.openai.tool_calls.calls import (
    ParsedToolCall,
    ToolCallParse,
    joined_content,
)

BlockReader = Callable[[str], ParsedToolCall | None]


@dataclass(frozen=True)
class Tags:
    open: str
    close: str


def split_blocks(text: str, tags: Tags) -> tuple[list[str], list[str]]:
    """The text outside the blocks (one more piece than blocks) and the blocks' bodies."""
    outside, bodies, position = [], [], 0
    while (start := text.find(tags.open, position)) >= 0:
        end = text.find(tags.close, start + len(tags.open))
        if end < 0:
            break
        outside.append(text[position:start])
        bodies.append(text[start + len(tags.open) : end])
        position = end + len(tags.close)
    outside.append(text[position:])
    return outside, bodies


def read_blocks(text: str, tags: Tags, read: BlockReader) -> ToolCallParse:
    outside, bodies = split_blocks(text, tags)
    calls, kept = [], [outside[0]]
    for body, after in zip(bodies, outside[1:], strict=True):
        call = read(body)
        if call is None:
            kept.append(tags.open + body + tags.close)
        else:
            calls.append(call)
        kept.append(after)
    if not calls:
        return ToolCallParse(text or None)
    return ToolCallParse(joined_content(kept), calls)


def read_section(text: str, section: Tags, tags: Tags, read: BlockReader) -> ToolCallParse:
    """Calls in blocks inside one section; the text outside the section is the content."""
    before, found, rest = text.partition(section.open)
    if not found:
        return ToolCallParse(text or None)
    inner, _, after = rest.partition(section.close)
    inside = read_blocks(inner, tags, read)
    if not inside.calls:
        return ToolCallParse(text or None)
    return ToolCallParse(joined_content([before, inside.content or "", after]), inside.calls)
