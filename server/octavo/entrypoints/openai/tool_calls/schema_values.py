"""Argument values written as bare text (Qwen3-Coder's ``<parameter=...>``, GLM-4.5's
``<arg_value>``), given their JSON types from the tool's ``parameters`` schema, as vLLM
reads them. Python literals are read with ``ast.literal_eval``, never ``eval``."""

from __future__ import annotations

import ast
import json
from typing import Any

from octavo.entrypoints.openai.tool_calls.calls import FunctionSchemas

STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
NUMBER_PREFIXES = ("num", "float")
BOOLEAN_TYPES = ("boolean", "bool", "binary")
NULL_WORDS = ("null", "none")


def declared_type(schemas: FunctionSchemas, function: str, name: str) -> str | None:
    """The parameter's declared type (the first non-null one of an ``anyOf``), or
    ``None`` when the tool or the parameter is unknown."""
    properties = (schemas.get(function) or {}).get("properties") or {}
    prop = properties.get(name)
    if not isinstance(prop, dict):
        return None
    if "type" in prop:
        kind = prop["type"]
        kinds = kind if isinstance(kind, list) else [kind]
    else:
        kinds = [option.get("type") for option in prop.get("anyOf", []) if isinstance(option, dict)]
    named = [str(kind).strip().lower() for kind in kinds if kind and kind != "null"]
    return named[0] if named else ("null" if kinds else "string")


def is_nullable(schemas: FunctionSchemas, function: str, name: str) -> bool:
    prop = ((schemas.get(function) or {}).get("properties") or {}).get(name)
    if not isinstance(prop, dict):
        return False
    kind = prop.get("type")
    options = prop.get("anyOf", [])
    return (
        kind == "null"
        or (isinstance(kind, list) and "null" in kind)
        or any(isinstance(option, dict) and option.get("type") == "null" for option in options)
    )


def typed_value(raw: str, kind: str | None, nullable: bool = False) -> Any:
    """``raw`` as the declared ``kind``; text that does not fit stays a string."""
    if kind is None:
        return raw
    if nullable and raw.lower() in NULL_WORDS:
        return None
    if kind in STRING_TYPES:
        return raw
    if raw.lower() in NULL_WORDS:
        return None
    if kind.startswith(INTEGER_PREFIXES):
        return _integer(raw)
    if kind.startswith(NUMBER_PREFIXES):
        return _number(raw)
    if kind in BOOLEAN_TYPES:
        return raw.lower() == "true"
    return literal_value(raw)


def literal_value(raw: str) -> Any:
    """JSON first, then a Python literal, else the text itself."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    try:
        value = ast.literal_eval(raw)
        json.dumps(value)  # sets, bytes, complex numbers: not JSON, so the text stays
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw
    return value


def _integer(raw: str) -> int | str:
    try:
        return int(raw)
    except ValueError:
        return raw


def _number(raw: str) -> float | int | str:
    try:
        value = float(raw)
    except ValueError:
        return raw
    return int(value) if value.is_integer() else value
