"""``pythonic`` (Llama 3.2, Llama 4, ToolACE): the reply is a Python list of calls,
``[get_weather(city="Paris"), get_time()]``, optionally inside Llama 4's
``<|python_start|>`` ... ``<|python_end|>``.

It is read with ``ast`` (never ``eval``): keyword arguments whose values are literals
(JSON's ``true``/``false``/``null`` too); anything else makes the reply content.
"""

from __future__ import annotations

import ast
from typing import Any

from octavo.entrypoints.openai.tool_calls.calls import (
    ParsedToolCall,
    ToolCallParse,
    ToolCallParser,
    arguments_text,
)

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
JSON_NAMES = {"true": True, "false": False, "null": None}


class NotACall(ValueError):
    pass


def parse_pythonic(text: str) -> ToolCallParse:
    body = text.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
    if not (body.startswith("[") and body.endswith("]")):
        return ToolCallParse(text or None)
    try:
        tree = ast.parse(body, mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            raise NotACall("not a list of calls")
        calls = [_call(element) for element in tree.elts]
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return ToolCallParse(text or None)
    return ToolCallParse(None, calls)


def _call(node: ast.expr) -> ParsedToolCall:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        raise NotACall("a call by name, with keyword arguments only")
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise NotACall("**kwargs")
        arguments[keyword.arg] = _literal(keyword.value)
    return ParsedToolCall(node.func.id, arguments_text(arguments))


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in JSON_NAMES:
        return JSON_NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(element) for element in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise NotACall("**mapping")
        pairs = zip(node.keys, node.values, strict=True)
        return {_key(key): _literal(value) for key, value in pairs}
    value = ast.literal_eval(node)
    arguments_text(value)  # sets, bytes, complex numbers are no JSON: TypeError
    return value


def _key(node: ast.expr | None) -> str:
    key = ast.literal_eval(node)
    if not isinstance(key, str):
        raise NotACall("a JSON object's keys are strings")
    return key


def pythonic_safe_prefix(text: str) -> int:
    """Nothing while the reply may still be a call list; everything once it cannot be."""
    head = text.lstrip()
    maybe_call = not head or head.startswith(("[", PYTHON_START)) or PYTHON_START.startswith(head)
    return 0 if maybe_call else len(text)


PYTHONIC = ToolCallParser(
    parse_pythonic,
    pythonic_safe_prefix,
    "[<function name>(<argument>=<value>, ...)] (a Python list of calls, e.g. "
    '[get_weather(city="Paris")])',
)
