"""The prompt shapes the offline ``LLM`` takes, as ``vllm.inputs`` spells them.

A prompt is a text, a list of token ids, a ``TextPrompt`` (``{"prompt": "..."}``) or a
``TokensPrompt`` (``{"prompt_token_ids": [...]}``); either dict may carry
``multi_modal_data`` (``{"image": image | [images]}``), kept beside the prompt as a
``MultiModalPrompt`` for the engine's processor. Anything else is refused at the call
with a ``TypeError`` (wrong type) or ``ValueError`` (right type, bad content) that says
what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

EXPECTED = (
    "a prompt is a string, a list of token ids, {'prompt': str} (TextPrompt) or "
    "{'prompt_token_ids': [int, ...]} (TokensPrompt)"
)


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""

    prompt: str
    multi_modal_data: NotRequired[Any]  # {"image": image | [images]}


class TokensPrompt(TypedDict):
    """A prompt given as token ids."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]  # ignored for generation, as in vLLM
    multi_modal_data: NotRequired[Any]  # {"image": image | [images]}


@dataclass
class MultiModalPrompt:
    """A prompt with its ``multi_modal_data``, before the engine's processor runs."""

    prompt: str | list[int]
    multi_modal_data: Any


PromptType = str | list[int] | TextPrompt | TokensPrompt
EnginePrompt = str | list[int] | MultiModalPrompt  # what LLM hands the engine


def parse_prompts(prompts: Any) -> list[EnginePrompt]:
    """One prompt or a sequence of them, as engine prompts (texts or token-id lists)."""
    if isinstance(prompts, str | dict) or _is_token_ids(prompts):
        return [parse_prompt(prompts)]
    if not isinstance(prompts, Sequence):
        raise TypeError(f"{EXPECTED}, or a list of prompts; got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts must not be empty")
    return [parse_prompt(prompt) for prompt in prompts]


def parse_prompt(prompt: Any) -> EnginePrompt:
    """One prompt as the engine takes it; TypeError/ValueError naming what is wrong."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        return _from_dict(prompt)
    if _is_token_ids(prompt):
        return list(prompt)
    if isinstance(prompt, list | tuple):
        raise TypeError(f"{EXPECTED}; a list must hold only integers (token ids)")
    raise TypeError(f"{EXPECTED}; got {type(prompt).__name__}")


def _from_dict(prompt: dict) -> EnginePrompt:
    if "multi_modal_data" in prompt:
        rest = {key: value for key, value in prompt.items() if key != "multi_modal_data"}
        return MultiModalPrompt(_from_dict(rest), prompt["multi_modal_data"])
    unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
    if unknown:
        raise ValueError(f"unknown prompt keys {unknown}; {EXPECTED}")
    if "prompt_token_ids" in prompt:
        ids = prompt["prompt_token_ids"]
        if not _is_token_ids(ids):
            raise TypeError("prompt_token_ids must be a list of integers (token ids)")
        return list(ids)
    if "prompt" not in prompt:
        raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids'; {EXPECTED}")
    if not isinstance(prompt["prompt"], str):
        raise TypeError(f"'prompt' must be a string, got {type(prompt['prompt']).__name__}")
    return prompt["prompt"]


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and all(isinstance(item, int) and not isinstance(item, bool) for item in value)
        and len(value) > 0
    )
