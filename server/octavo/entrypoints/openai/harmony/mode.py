"""Which chat requests speak Harmony, and what that changes in their generation.

As vLLM decides it: a gpt-oss model (its architecture) always does; so does any model
served with ``--reasoning-parser openai_gptoss`` or ``--tool-call-parser openai``. Its
prompts are rendered by ``openai-harmony`` (``render.py``); its replies are generated
with their special tokens kept in the text (the channel markers the reader needs) and
stop at ``<|return|>`` or ``<|call|>``. With ``tool_choice`` a named function or
``required`` the reply is the constrained JSON itself, read as the chat path reads it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from octavo.entrypoints.openai.harmony.choices import HarmonyChoices
from octavo.entrypoints.openai.tool_calls.plan import ToolPlan
from octavo.sampling_params import SamplingParams

HARMONY_ARCHITECTURES = frozenset(["GptOssForCausalLM"])
HARMONY_REASONING_PARSER = "openai_gptoss"
HARMONY_TOOL_CALL_PARSER = "openai"
STOP_TOKENS = ("<|return|>", "<|call|>")


def speaks_harmony(
    architecture: str, reasoning_parser: str | None, tool_parser: str | None
) -> bool:
    return (
        architecture in HARMONY_ARCHITECTURES
        or reasoning_parser == HARMONY_REASONING_PARSER
        or tool_parser == HARMONY_TOOL_CALL_PARSER
    )


def harmony_params(params: SamplingParams, tokenizer: Any) -> SamplingParams:
    """Special tokens kept in the text; ``<|return|>`` and ``<|call|>`` end the reply."""
    stops = [_token_id(tokenizer, token) for token in STOP_TOKENS]
    stops = [token_id for token_id in stops if token_id is not None]
    stop_token_ids = [*(params.stop_token_ids or []), *stops]
    return dataclasses.replace(
        params, skip_special_tokens=False, stop_token_ids=stop_token_ids or None
    )


def harmony_choices(tools: ToolPlan, include_reasoning: bool) -> HarmonyChoices | None:
    """How the request's replies are read (None: constrained calls, the chat path's)."""
    if tools.mode in ("named", "required"):
        return None
    return HarmonyChoices(tools.mode == "auto", tools.parallel, include_reasoning)


def _token_id(tokenizer: Any, token: str) -> int | None:
    """``token``'s id, None where the tokenizer does not have it as one token."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    return None if token_id is None or token_id == tokenizer.unk_token_id else token_id
