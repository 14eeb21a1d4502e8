"""Reading tool calls out of a model's text (``tool_choice: auto``), per model family.

``--tool-call-parser`` picks one, as in vLLM:

- ``hermes`` (Hermes, Qwen2/2.5): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks, any number, text around them is the message's content;
- ``llama3_json`` (Llama 3.1+): the whole output is one JSON object ``{"name": ...,
  "parameters": {...}}`` (or several separated by ``;``), optionally after
  ``<|python_tag|>``;
- the 2025 families, each in its own module: ``mistral``, ``pythonic`` (Llama 3.2/4),
  ``deepseek_v3``, ``qwen3_coder``, ``glm45`` (GLM-4.5/4.6), ``kimi_k2``.

A block that is not valid JSON, or lacks a name, is left in the content: the client
sees what the model wrote rather than a call that was never made.
"""

from __future__ import annotations

import json
import re

from octavo.entrypoints.openai.harmony.reply import OPENAI
from octavo.entrypoints.openai.tool_calls.calls import (
    ParsedToolCall,
    ToolCallParse,
    ToolCallParser,
)
from octavo.entrypoints.openai.tool_calls.deepseek_v3 import DEEPSEEK_V3
from octavo.entrypoints.openai.tool_calls.glm45 import GLM45
from octavo.entrypoints.openai.tool_calls.kimi_k2 import KIMI_K2
from octavo.entrypoints.openai.tool_calls.mistral import MISTRAL
from octavo.entrypoints.openai.tool_calls.pythonic import PYTHONIC
from octavo.entrypoints.openai.tool_calls.qwen3_coder import QWEN3_CODER

__all__ = ["TOOL_CALL_PARSERS", "ParsedToolCall", "ToolCallParse", "ToolCallParser"]

HERMES_OPEN = "<tool_call>"
HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"


def parse_hermes(text: str) -> ToolCallParse:
    calls, kept, position = [], [], 0
    for match in HERMES_BLOCK.finditer(text):
        call = _call_from_json(match.group(1), ("arguments", "parameters"))
        kept.append(text[position : match.start()] if call else text[position : match.end()])
        position = match.end()
        if call:
            calls.append(call)
    if not calls:
        return ToolCallParse(text or None)  # plain content, exactly as written
    kept.append(text[position:])
    content = "".join(kept).strip()
    return ToolCallParse(content or None, calls)


def parse_llama3_json(text: str) -> ToolCallParse:
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        return ToolCallParse(text or None)
    calls = [_call_from_json(part, ("parameters", "arguments")) for part in _json_objects(body)]
    if not calls or None in calls:
        return ToolCallParse(text or None)
    return ToolCallParse(None, calls)


def _json_objects(body: str) -> list[str]:
    """``{...}; {...}`` split into its objects (a decoder walks, so ';' inside strings is safe)."""
    decoder, parts, position = json.JSONDecoder(), [], 0
    while position < len(body):
        try:
            _, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return []
        parts.append(body[position:end])
        position = end
        while position < len(body) and body[position] in " \n\t;":
            position += 1
    return parts


def _call_from_json(text: str, argument_keys: tuple[str, ...]) -> ParsedToolCall | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = next((value[key] for key in argument_keys if key in value), {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        return ParsedToolCall(value["name"], arguments)
    return ParsedToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def hermes_safe_prefix(text: str) -> int:
    """How much of a streamed text is surely content: up to the first ``<tool_call>``, and
    never a tail that may be the start of one."""
    start = text.find(HERMES_OPEN)
    if start >= 0:
        return start
    for length in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(HERMES_OPEN[:length]):
            return len(text) - length
    return len(text)


def llama3_json_safe_prefix(text: str) -> int:
    """Nothing while the text may still be a JSON call; everything once it cannot be."""
    head = text.lstrip()
    maybe_call = not head or head.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(head)
    return 0 if maybe_call else len(text)


TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "hermes": ToolCallParser(
        parse_hermes,
        hermes_safe_prefix,
        '<tool_call>{"name": <function name>, "arguments": <arguments object>}</tool_call>',
    ),
    "llama3_json": ToolCallParser(
        parse_llama3_json,
        llama3_json_safe_prefix,
        '{"name": <function name>, "parameters": <arguments object>}',
    ),
    "mistral": MISTRAL,
    "pythonic": PYTHONIC,
    "deepseek_v3": DEEPSEEK_V3,
    "qwen3_coder": QWEN3_CODER,
    "glm45": GLM45,
    "kimi_k2": KIMI_K2,
    "openai": OPENAI,  # gpt-oss Harmony (harmony/): commentary to=functions.NAME
}
TOOL_CALL_PARSER_NAMES = tuple(TOOL_CALL_PARSERS)
