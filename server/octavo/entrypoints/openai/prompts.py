"""Turning request inputs into token ids: completion prompts and chat conversations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.protocol import ChatMessage, PromptInput


@dataclass
class Prompt:
    token_ids: list[int]
    text: str | None = None  # the text the client sent, if it sent text


def completion_prompts(prompt: PromptInput, tokenizer: Any) -> list[Prompt]:
    """The four accepted shapes: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        items: list[str | list[int]] = [prompt]
    elif not prompt:
        raise bad_request("prompt must not be empty", param="prompt")
    elif all(isinstance(item, int) for item in prompt):
        items = [list(prompt)]  # type: ignore[arg-type]
    else:
        items = list(prompt)  # type: ignore[arg-type]
    return [_one_prompt(item, tokenizer) for item in items]


def _one_prompt(item: str | list[int], tokenizer: Any) -> Prompt:
    if not item:
        raise bad_request("prompt must not be empty", param="prompt")
    if isinstance(item, str):
        return Prompt(token_ids=tokenizer.encode(item), text=item)
    size = len(tokenizer)
    if any(not 0 <= token < size for token in item):
        raise bad_request(f"prompt token ids must be in [0, {size})", param="prompt")
    return Prompt(token_ids=list(item))


def prompt_text(prompt: Prompt, tokenizer: Any) -> str:
    """The prompt as text (decoded when the client sent token ids), for ``echo``."""
    if prompt.text is not None:
        return prompt.text
    return tokenizer.decode(prompt.token_ids, skip_special_tokens=False)


def render_chat(
    messages: list[ChatMessage], tokenizer: Any, add_generation_prompt: bool = True
) -> list[int]:
    """Apply the tokenizer's chat template, then tokenize the text it produced."""
    conversation = [_message_dict(message) for message in messages]
    try:
        text = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as error:  # jinja errors (e.g. roles must alternate), no template
        raise bad_request(f"could not apply the chat template: {error}", "messages") from None
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    if not token_ids:
        raise bad_request("the conversation renders to an empty prompt", param="messages")
    return token_ids


def _message_dict(message: ChatMessage) -> dict[str, str]:
    role = "system" if message.role == "developer" else message.role
    entry = {"role": role, "content": message.text()}
    if message.name:
        entry["name"] = message.name
    return entry
