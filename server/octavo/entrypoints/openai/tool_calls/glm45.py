"""``glm45`` (GLM-4.5, GLM-4.6): the function's name, then key/value pairs::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

A value the schema declares a string is taken as written; any other value is read as
JSON, then as a Python literal, else kept as text (as vLLM). The text around the blocks is
the content.
"""

from __future__ import annotations

import re

from octavo.entrypoints.openai.tool_calls.blocks import Tags, read_blocks
from octavo.entrypoints.openai.tool_calls.calls import (
    NO_SCHEMAS,
    FunctionSchemas,
    ParsedToolCall,
    ToolCallParse,
    ToolCallParser,
    arguments_text,
    closed_through,
    marker_safe_prefix,
)
from octavo.entrypoints.openai.tool_calls.schema_values import declared_type, literal_value

BLOCK = Tags("<tool_call>", "</tool_call>")
ARG_KEY = "<arg_key>"
PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
BAD_NAME = re.compile(r"[\s<>{}\"']")


def read_glm45_call(body: str, schemas: FunctionSchemas) -> ParsedToolCall | None:
    name_end = min(at for at in (body.find("\n"), body.find(ARG_KEY), len(body)) if at >= 0)
    name = body[:name_end].strip()
    if not name or BAD_NAME.search(name):
        return None
    arguments = {}
    for key, value in PAIR.findall(body[name_end:]):
        key = key.strip()
        is_text = declared_type(schemas, name, key) == "string"
        arguments[key] = value if is_text else literal_value(value.strip())
    return ParsedToolCall(name, arguments_text(arguments))


def parse_glm45(text: str, schemas: FunctionSchemas = NO_SCHEMAS) -> ToolCallParse:
    return read_blocks(text, BLOCK, lambda body: read_glm45_call(body, schemas))


def glm45_safe_prefix(text: str) -> int:
    return marker_safe_prefix(text, (BLOCK.open,))


GLM45 = ToolCallParser(
    parse_glm45,
    glm45_safe_prefix,
    "<tool_call><function name>\n<arg_key><argument name></arg_key>\n"
    "<arg_value><value></arg_value>\n</tool_call>",
    typed_parse=parse_glm45,
    settled=closed_through(BLOCK.close),
)
