"""Turning request inputs into token ids: completion prompts and chat conversations.

These functions run in the tokenizer threads (``tokenizer_pool.py``), never on the event
loop. A text that surely cannot fit in the context is refused before it is tokenized.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.protocol import ChatMessage, PromptInput, ToolCall
from octavo.inputs.chat import ChatOptions, render_chat_prompt
from octavo.inputs.chat_images import split_images
from octavo.inputs.encoding import encode_texts
from octavo.inputs.token_range import check_prompt_token_ids

if TYPE_CHECKING:
    from octavo.multimodal.processor import ProcessedPrompt

PromptItem = str | list[int]


@dataclass
class Prompt:
    token_ids: list[int]
    text: str | None = None  # the text the client sent, if it sent text


def prompt_items(prompt: PromptInput) -> list[PromptItem]:
    """The four accepted shapes as a list of prompts: strings or lists of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("prompt must not be empty", param="prompt")
    if all(isinstance(item, int) for item in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


def completion_prompts(items: list[PromptItem], info: EngineInfo) -> list[Prompt]:
    """Tokenize the text prompts (all in one batch) and check the token-id ones."""
    if any(not item for item in items):
        raise bad_request("prompt must not be empty", param="prompt")
    texts = [item for item in items if isinstance(item, str)]
    for text in texts:
        check_text_fits(text, info, "prompt")
    encoded = iter(encode_texts(info.tokenizer, texts))
    return [
        Prompt(next(encoded), item) if isinstance(item, str) else _token_prompt(item, info)
        for item in items
    ]


def _token_prompt(item: list[int], info: EngineInfo) -> Prompt:
    try:
        check_prompt_token_ids(item, info.prompt_token_limit)
    except ValueError as error:
        raise bad_request(str(error), param="prompt") from None
    return Prompt(token_ids=list(item))


def check_text_fits(text: str, info: EngineInfo, param: str) -> None:
    """400 for a text too long for the context whatever its tokens (no tokenizing)."""
    if len(text) > info.max_prompt_chars:
        raise bad_request(
            f"the {param} is {len(text)} characters long; no text over "
            f"{info.max_prompt_chars} characters fits in this model's context of "
            f"{info.max_model_len} tokens",
            param=param,
        )


def tokenize_text(text: str, info: EngineInfo, add_special_tokens: bool) -> list[int]:
    """``/tokenize`` of a plain prompt."""
    check_text_fits(text, info, "prompt")
    return encode_texts(info.tokenizer, [text], add_special_tokens)[0]


def detokenize_ids(token_ids: list[int], info: EngineInfo) -> str:
    """``/detokenize``: the text of token ids, each checked against the vocabulary."""
    size = info.tokenizer_size
    if any(not 0 <= token < size for token in token_ids):
        raise bad_request(f"token ids must be in [0, {size})", param="tokens")
    return info.tokenizer.decode(token_ids)


def prompt_text(prompt: Prompt, tokenizer: Any) -> str:
    """The prompt as text (decoded when the client sent token ids), for ``echo``."""
    if prompt.text is not None:
        return prompt.text
    return tokenizer.decode(prompt.token_ids, skip_special_tokens=False)


def render_chat(
    messages: list[ChatMessage],
    info: EngineInfo,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    options: ChatOptions | None = None,
) -> list[int] | ProcessedPrompt:
    """The conversation's prompt token ids, rendered exactly as ``LLM.chat`` renders it
    (``options``, when given, replaces ``add_generation_prompt``); with image parts, the
    prompt the model's processor made of the rendered text and the decoded images."""
    conversation = [_message_dict(message) for message in messages]

    def check_fits(text: str) -> None:
        check_text_fits(text, info, "messages")

    try:
        conversation, images = split_images(conversation, *_image_placeholder(info, options))
        prompt = render_chat_prompt(
            info.tokenizer, conversation, add_generation_prompt, check_fits, tools, options
        )
        if images:  # the template wrote the special tokens: none are added
            info.image_processor.check_count(len(images))  # before anything is fetched
            sources = info.media.load_all(images)  # http(s) and file URLs: their bytes
            return info.image_processor.process(prompt.text, sources, False)
    except ValueError as error:  # the template failed, rendered nothing, or an image
        param = "tools" if "support tools" in str(error) else "messages"
        raise bad_request(str(error), param=param) from None
    return prompt.token_ids


def _image_placeholder(info: EngineInfo, options: ChatOptions | None) -> tuple[str | None, str]:
    """The model's image placeholder (None: text-only) and the chat template in use."""
    processor = info.image_processor
    template = (options.chat_template if options else None) or info.tokenizer.chat_template
    return (None if processor is None else processor.prompt_image_token), template or ""


def _message_dict(message: ChatMessage) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    content: Any = message.text()
    if message.has_images():  # the parts, for split_images
        content = [part.model_dump() for part in message.content]
    entry: dict[str, Any] = {"role": role, "content": content}
    if message.name:
        entry["name"] = message.name
    if message.tool_calls:
        entry["tool_calls"] = [_call_dict(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        entry["tool_call_id"] = message.tool_call_id
    return entry


def _call_dict(call: ToolCall) -> dict[str, Any]:
    """Templates expect the arguments as an object (they ``tojson`` them), as vLLM passes."""
    try:
        arguments: Any = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        arguments = call.function.arguments
    function = {"name": call.function.name, "arguments": arguments}
    return {"id": call.id, "type": "function", "function": function}
