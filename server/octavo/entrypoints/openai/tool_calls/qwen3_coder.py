"""``qwen3_coder`` (Qwen3-Coder, Qwen3-Next, Qwen3.5): XML-like calls whose values are
bare text, typed by the tool's ``parameters`` schema (``schema_values.py``)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

One newline after ``<parameter=...>`` and one before ``</parameter>`` are layout, not
value. The text around the blocks is the content. A reply with no ``<tool_call>`` block
but bare ``<function=...>`` ... ``</function>`` blocks is read from those (as vLLM).
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
from octavo.entrypoints.openai.tool_calls.schema_values import (
    declared_type,
    is_nullable,
    typed_value,
)

BLOCK = Tags("<tool_call>", "</tool_call>")
BARE = Tags("<function=", "</function>")
FUNCTION = re.compile(r"\s*<function=(?P<name>[^\s<>{}\"']+)>(?P<body>.*)</function>\s*", re.DOTALL)
PARAMETER = re.compile(r"<parameter=(?P<name>[^>\n]+)>(?P<value>.*?)</parameter>", re.DOTALL)


def read_qwen3_coder_call(body: str, schemas: FunctionSchemas) -> ParsedToolCall | None:
    function = FUNCTION.fullmatch(body)
    if function is None:
        return None
    name, arguments = function["name"], {}
    for parameter in PARAMETER.finditer(function["body"]):
        key, raw = parameter["name"].strip(), _unwrapped(parameter["value"])
        kind = declared_type(schemas, name, key)
        arguments[key] = typed_value(raw, kind, is_nullable(schemas, name, key))
    return ParsedToolCall(name, arguments_text(arguments))


def _unwrapped(value: str) -> str:
    return value.removeprefix("\n").removesuffix("\n")


def parse_qwen3_coder(text: str, schemas: FunctionSchemas = NO_SCHEMAS) -> ToolCallParse:
    parsed = read_blocks(text, BLOCK, lambda body: read_qwen3_coder_call(body, schemas))
    if parsed.calls or BLOCK.open in text:
        return parsed
    return read_blocks(text, BARE, lambda body: read_qwen3_coder_call(_bare(body), schemas))


def _bare(body: str) -> str:
    return BARE.open + body + BARE.close


def qwen3_coder_settled(text: str) -> int:
    """After the last ``</tool_call>``, once a ``<tool_call>`` settles the reply's form
    (bare ``<function=...>`` calls are only known to be calls at the end)."""
    end = closed_through(BLOCK.close)(text)
    return end if BLOCK.open in text[:end] else 0


def qwen3_coder_safe_prefix(text: str) -> int:
    return marker_safe_prefix(text, (BLOCK.open, BARE.open))


QWEN3_CODER = ToolCallParser(
    parse_qwen3_coder,
    qwen3_coder_safe_prefix,
    "<tool_call>\n<function=<function name>>\n<parameter=<argument name>>\n<value>\n"
    "</parameter>\n</function>\n</tool_call>",
    typed_parse=parse_qwen3_coder,
    settled=qwen3_coder_settled,
)
