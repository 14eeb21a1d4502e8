"""``deepseek_v3`` (DeepSeek-V3, R1-0528): calls in DeepSeek's full-width special tokens::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(``｜`` is U+FF5C, ``▁`` U+2581.) The text outside the section is the content.
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

SECTION = Tags("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
CALL = Tags("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
SEPARATOR = "<｜tool▁sep｜>"
CALL_BODY = re.compile(
    r"\s*(?P<type>[^\n<]*)" + re.escape(SEPARATOR) + r"(?P<name>[^\n]+)\n"
    r"```json\n(?P<arguments>.*)\n```\s*",
    re.DOTALL,
)


def read_deepseek_v3_call(body: str) -> ParsedToolCall | None:
    match = CALL_BODY.fullmatch(body)
    if match is None or not match["name"].strip():
        return None
    return ParsedToolCall(match["name"].strip(), normalized_arguments(match["arguments"]))


def parse_deepseek_v3(text: str) -> ToolCallParse:
    return read_section(text, SECTION, CALL, read_deepseek_v3_call)


def deepseek_v3_safe_prefix(text: str) -> int:
    return marker_safe_prefix(text, (SECTION.open,))


DEEPSEEK_V3 = ToolCallParser(
    parse_deepseek_v3,
    deepseek_v3_safe_prefix,
    f"{SECTION.open}{CALL.open}function{SEPARATOR}<function name>\n```json\n"
    f"<arguments object>\n```{CALL.close}{SECTION.close}",
    settled=closed_through(CALL.close),
)
