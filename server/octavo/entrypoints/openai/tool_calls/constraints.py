"""``tool_choice`` as a structured-output constraint, and reading the constrained output.

- a named function: the output is that function's arguments, constrained by its
  ``parameters`` schema;
- ``required``: the output is a JSON array of ``{"name", "parameters"}`` objects, each
  matching one of the tools (one item when ``parallel_tool_calls`` is false).
"""

from __future__ import annotations

import json
from typing import Any

from octavo.entrypoints.openai.tool_calls.parsers import ParsedToolCall
from octavo.structured_output.params import StructuredOutputsParams

ANY_OBJECT: dict[str, Any] = {"type": "object"}


def named_call_constraint(parameters: dict[str, Any] | None) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=parameters or ANY_OBJECT)


def required_calls_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """``tools``: OpenAI function definitions ``{"name", "parameters", ...}``."""
    choices = [
        {
            "type": "object",
            "properties": {
                "name": {"enum": [tool["name"]]},
                "parameters": tool.get("parameters") or ANY_OBJECT,
            },
            "required": ["name", "parameters"],
        }
        for tool in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": choices}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def required_calls_constraint(
    tools: list[dict[str, Any]], parallel: bool
) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=required_calls_schema(tools, parallel))


def calls_from_required_output(text: str) -> list[ParsedToolCall]:
    """The calls in a ``required`` output (``ValueError`` if it is cut short)."""
    items = json.loads(text)
    return [
        ParsedToolCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False))
        for item in items
    ]
