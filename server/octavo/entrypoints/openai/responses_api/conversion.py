"""A Responses request as a chat completion request, and a response's output as the
assistant turn the next chained request (``previous_response_id``) shows the model.

``instructions`` become a system message first; they belong to their own request only
(as OpenAI: a chained request does not inherit the earlier one's instructions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    ToolCall,
)
from octavo.entrypoints.openai.responses_api.input_items import input_messages
from octavo.entrypoints.openai.responses_api.objects import (
    FunctionCallItem,
    MessageItem,
    OutputItem,
)
from octavo.entrypoints.openai.responses_api.protocol import ResponsesRequest
from octavo.entrypoints.openai.responses_api.request_options import (
    chat_response_format,
    chat_tool_choice,
    chat_tools,
)

# The chat pipeline's field names, as the Responses request spells them (for 400s).
RESPONSES_PARAMS = {
    "messages": "input",
    "prompt": "input",
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
}


@dataclass
class ChatConversion:
    chat: ChatCompletionRequest
    history: list[ChatMessage]  # the earlier turns and this input, without instructions


def to_chat_request(body: ResponsesRequest, earlier: list[ChatMessage]) -> ChatConversion:
    """The chat request that generates ``body``'s response after the ``earlier`` turns."""
    history = [*earlier, *input_messages(body.input)]
    system = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": [*system, *history],
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "request_id": body.request_id,
        "cache_salt": body.cache_salt,
        "kv_transfer_params": body.kv_transfer_params,
        "response_format": chat_response_format(body.text),
        "tools": chat_tools(body.tools),
        "tool_choice": chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "chat_template_kwargs": _reasoning_kwargs(body.reasoning),
    }
    try:
        chat = ChatCompletionRequest(**fields)
    except ValidationError as error:
        raise _as_bad_request(error) from None
    return ChatConversion(chat, history)


def _reasoning_kwargs(reasoning: dict[str, Any] | None) -> dict[str, Any] | None:
    """``reasoning.effort`` reaches the chat template as ``reasoning_effort`` (as vLLM)."""
    effort = (reasoning or {}).get("effort")
    return {"reasoning_effort": effort} if effort is not None else None


def _as_bad_request(error: ValidationError) -> APIError:
    item = error.errors()[0]
    location = [str(part) for part in item.get("loc", ())]
    field = location[0] if location else None
    param = RESPONSES_PARAMS.get(field, field) if field else None
    message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
    return bad_request(f"{param}: {message}" if param else message, param=param)


def responses_param(param: str | None) -> str | None:
    """A chat pipeline 400's ``param`` in the Responses request's terms."""
    return RESPONSES_PARAMS.get(param, param) if param else param


def output_messages(output: list[OutputItem]) -> list[ChatMessage]:
    """A response's output as the assistant turn of the conversation (reasoning dropped)."""
    text = "".join(
        part.text for item in output if isinstance(item, MessageItem) for part in item.content
    )
    calls = [
        ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
        for item in output
        if isinstance(item, FunctionCallItem)
    ]
    if not text and not calls:
        return [ChatMessage(role="assistant", content="")]
    return [ChatMessage(role="assistant", content=text or None, tool_calls=calls or None)]
