"""Responses ``input`` items as chat messages.

- a string: one user message;
- message items (``{"role", "content"}``, ``type`` "message" or left out): ``content``
  a string or a list of ``input_text`` / ``output_text`` / ``refusal`` parts, and
  ``input_image`` parts (``content_parts.py``: they take the chat path's images);
- ``function_call`` items: the assistant's calls (consecutive ones, and the assistant
  message right before them, make one assistant turn);
- ``function_call_output`` items: tool messages answering ``call_id``;
- ``reasoning`` items: dropped (earlier reasoning is not shown to the model again).

Anything else is a 400 naming the item's field (``input[2].type``).
"""

from __future__ import annotations

from typing import Any

from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.protocol import ChatMessage, FunctionCall, ToolCall
from octavo.entrypoints.openai.responses_api.content_parts import (
    TEXT_PARTS,
    chat_parts,
    has_image_parts,
)

MESSAGE_ROLES = ("user", "system", "developer", "assistant")


def input_messages(items: str | list[dict[str, Any]]) -> list[ChatMessage]:
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    messages: list[ChatMessage] = []
    for index, item in enumerate(items):
        path = f"input[{index}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, path))
        elif kind == "function_call":
            _add_call(messages, _call(item, path))
        elif kind == "function_call_output":
            messages.append(_call_output(item, path))
        elif kind != "reasoning":
            raise bad_request(
                f"input item type {kind!r} is not supported (supported: message, "
                "function_call, function_call_output, reasoning)",
                param=f"{path}.type",
            )
    return messages


def _message(item: dict[str, Any], path: str) -> ChatMessage:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise bad_request(
            f"message role {role!r} is not one of {', '.join(MESSAGE_ROLES)}",
            param=f"{path}.role",
        )
    content = item.get("content")
    if has_image_parts(content):  # input_image parts: the chat path's image_url parts
        return ChatMessage(role=role, content=chat_parts(content, f"{path}.content"))
    return ChatMessage(role=role, content=content_text(content, f"{path}.content"))


def content_text(content: Any, path: str) -> str:
    """A string, or text parts joined; images, files and audio are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of content parts", param=path)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        field = TEXT_PARTS.get(kind)
        if field is None or not isinstance(part.get(field), str):
            raise bad_request(
                f"content part type {kind!r} is not supported (this server takes text: "
                "input_text, output_text, refusal; and input_image in messages)",
                param=f"{path}[{index}].type",
            )
        texts.append(part[field])
    return "".join(texts)


def _call(item: dict[str, Any], path: str) -> ToolCall:
    for field in ("call_id", "name", "arguments"):
        if not isinstance(item.get(field), str):
            raise bad_request(f"function_call items need a string {field}", f"{path}.{field}")
    function = FunctionCall(name=item["name"], arguments=item["arguments"])
    return ToolCall(id=item["call_id"], function=function)


def _add_call(messages: list[ChatMessage], call: ToolCall) -> None:
    """The call joins the assistant turn just before it, or starts one."""
    if messages and messages[-1].role == "assistant":
        last = messages[-1]
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(ChatMessage(role="assistant", tool_calls=[call]))


def _call_output(item: dict[str, Any], path: str) -> ChatMessage:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise bad_request("function_call_output items need a string call_id", f"{path}.call_id")
    output = content_text(item.get("output"), f"{path}.output")
    return ChatMessage(role="tool", content=output, tool_call_id=call_id)
