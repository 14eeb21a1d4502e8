"""Responses ``tools``, ``tool_choice`` and ``text.format`` in chat completion terms.

Only ``function`` tools run here: OpenAI's built-in tools (``web_search``,
``file_search``, ``code_interpreter``, ``computer_use_preview``, ``mcp``, ...) need
OpenAI's own services, so they are a 400 naming the tool type.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.protocol import (
    FunctionDefinition,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ToolDefinition,
)

TOOL_CHOICE_MODES = ("auto", "required", "none")
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")


def chat_tools(tools: list[dict[str, Any]] | None) -> list[ToolDefinition] | None:
    if tools is None:
        return None
    return [_function_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]


def _function_tool(tool: dict[str, Any], path: str) -> ToolDefinition:
    kind = tool.get("type")
    if kind != "function":
        raise bad_request(
            f"tool type {kind!r} is not supported by this server (only 'function' tools; "
            "built-in tools such as web_search or file_search need OpenAI's services)",
            param=f"{path}.type",
        )
    unknown = sorted(set(tool) - {"type", *FUNCTION_FIELDS})
    if unknown:  # never used, yet echoed and stored with the response
        raise bad_request(
            f"function tools take only type, {', '.join(FUNCTION_FIELDS)}; got {unknown}",
            param=f"{path}.{unknown[0]}",
        )
    fields = {key: tool[key] for key in FUNCTION_FIELDS if tool.get(key) is not None}
    try:
        function = FunctionDefinition(**fields)
    except ValidationError as error:
        raise bad_request(_first_message(error), param=f"{path}.{_first_field(error)}") from None
    return ToolDefinition(type="function", function=function)


def chat_tool_choice(choice: Any) -> str | NamedToolChoice | None:
    if choice is None or (isinstance(choice, str) and choice in TOOL_CHOICE_MODES):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if isinstance(name, str):
            return NamedToolChoice(type="function", function=NamedFunction(name=name))
    raise bad_request(
        "tool_choice must be 'auto', 'required', 'none' or {'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def chat_response_format(text: dict[str, Any] | None) -> ResponseFormat | None:
    """``text.format`` (text, json_object, json_schema) as chat's ``response_format``."""
    spec = (text or {}).get("format")
    if spec is None:
        return None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind in ("text", "json_object"):
        return ResponseFormat(type=kind)
    if kind != "json_schema":
        raise bad_request(
            f"text.format type {kind!r} is not one of text, json_object, json_schema",
            param="text.format.type",
        )
    fields = {key: spec[key] for key in ("name", "description", "schema", "strict") if key in spec}
    try:
        schema = JsonSchemaFormat(**fields)
    except ValidationError as error:
        field = _first_field(error)
        raise bad_request(_first_message(error), param=f"text.format.{field}") from None
    return ResponseFormat(type="json_schema", json_schema=schema)


def _first_field(error: ValidationError) -> str:
    location = error.errors()[0].get("loc", ())
    return str(location[0]) if location else "type"


def _first_message(error: ValidationError) -> str:
    item = error.errors()[0]
    return f"{_first_field(error)}: {item.get('msg', 'invalid value')}"
