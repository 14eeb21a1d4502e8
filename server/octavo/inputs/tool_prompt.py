"""Tools for a chat template that never mentions them: the fallback tool prompt.

When a conversation has tools (or earlier tool calls and results) and its chat template
never uses ``tools``, the conversation itself is rewritten into plain turns every
template can show (``--tool-prompt-fallback``, on by default):

- the tool definitions go in the system message (after its text; a system message is
  put first when there is none)::

      # Tools

      You can call these functions (one JSON schema per line):
      {"name": "get_weather", "description": "...", "parameters": {...}}

      <how to reply: see ``reply_instruction``>

- an assistant message's ``tool_calls`` become text after its content: a JSON array of
  ``{"name": ..., "parameters": {...}}`` objects (the shape of a ``required`` reply);
- a ``tool`` message becomes a user turn ``Tool result (call id ID, function NAME):``
  followed by its content; results in a row, and a user message right after them, share
  one user turn (templates that demand alternating roles accept it).

The format is stable: the same request always renders the same text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
TOOLS_HEADER = "# Tools\n\nYou can call these functions (one JSON schema per line):"
REQUIRED_CALL = '{"name": <function name>, "parameters": <arguments object>}'
GENERIC_CALL = '{"name": <function name>, "arguments": <arguments object>}'


@dataclass(frozen=True)
class ToolChoice:
    """What the request's ``tool_choice`` asks of the reply (for the fallback prompt)."""

    mode: str = "auto"  # "auto", "required" or "named"
    name: str | None = None  # the named function
    parallel: bool = True  # parallel_tool_calls
    call_format: str | None = None  # auto: how the server's --tool-call-parser reads a call


def has_tool_messages(conversation: list[Message]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in conversation)


AUTO = ToolChoice()  # tool_choice auto with no parser: the generic call format


def with_tool_prompt(
    conversation: list[Message],
    tools: list[dict[str, Any]] | None,
    choice: ToolChoice = AUTO,
) -> list[Message]:
    """``conversation`` in plain turns: tool calls and results as text, and the ``tools``
    (when any) in the system message with how ``choice`` wants the reply."""
    messages = tool_messages_as_text(conversation)
    if not tools:
        return messages
    block = tools_block(tools, choice)
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": _joined(first.get("content"), block)}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def tools_block(tools: list[dict[str, Any]], choice: ToolChoice) -> str:
    """The tool definitions and how to reply, as the system message shows them."""
    schemas = "\n".join(_dumps(tool.get("function", tool)) for tool in tools)
    return f"{TOOLS_HEADER}\n{schemas}\n\n{reply_instruction(choice)}"


def reply_instruction(choice: ToolChoice) -> str:
    """How to write a call: exactly the shape the output constraint allows for
    ``required`` and named calls, the parser's format for ``auto``."""
    if choice.mode == "named":
        return (
            f'You must call the function "{choice.name}". Reply with only its arguments: '
            'a JSON object matching its "parameters" schema.'
        )
    if choice.mode == "required":
        if not choice.parallel:
            return (
                "You must call exactly one of these functions. Reply with only a JSON "
                f"array holding one call: [{REQUIRED_CALL}]."
            )
        return (
            "You must call at least one of these functions. Reply with only a JSON array "
            f"of calls, each {REQUIRED_CALL}."
        )
    call = choice.call_format or GENERIC_CALL
    return f"To call a function, reply with {call}; otherwise answer in plain text."


def tool_messages_as_text(conversation: list[Message]) -> list[Message]:
    """Assistant ``tool_calls`` as text, ``tool`` results as user turns (merged as the
    module describes)."""
    names = _call_names(conversation)
    out: list[Message] = []
    after_results = False
    for message in conversation:
        role = message.get("role")
        if role == "tool":
            text = _result_text(message, names)
        elif role == "user" and after_results:
            text = _text(message.get("content"))
        else:
            out.append(_calls_as_text(message) if message.get("tool_calls") else message)
            after_results = False
            continue
        if after_results:
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n\n{text}"}
        else:
            out.append({"role": "user", "content": text})
        after_results = role == "tool"
    return out


def _calls_as_text(message: Message) -> Message:
    calls = [
        {"name": call["function"]["name"], "parameters": _arguments(call["function"])}
        for call in message["tool_calls"]
    ]
    entry = {key: value for key, value in message.items() if key != "tool_calls"}
    entry["content"] = _joined(message.get("content"), _dumps(calls), "\n")
    return entry


def _result_text(message: Message, names: dict[str, str]) -> str:
    call_id = message.get("tool_call_id")
    name = names.get(call_id) or message.get("name")
    label = f"call id {call_id}, function {name}" if name else f"call id {call_id}"
    return f"Tool result ({label}):\n{_text(message.get('content'))}"


def _call_names(conversation: list[Message]) -> dict[str, str]:
    """Each earlier call's id → its function's name."""
    return {
        call["id"]: call["function"]["name"]
        for message in conversation
        for call in message.get("tool_calls") or []
        if call.get("id")
    }


def _arguments(function: dict[str, Any]) -> Any:
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments if arguments is not None else {}


def _joined(content: Any, addition: str, separator: str = "\n\n") -> Any:
    """``content`` (text, text parts or nothing) with ``addition`` after it."""
    if isinstance(content, list):
        return [*content, {"type": "text", "text": separator + addition}]
    text = _text(content)
    return f"{text}{separator}{addition}" if text else addition


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return content or ""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
