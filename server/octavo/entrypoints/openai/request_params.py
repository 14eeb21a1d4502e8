"""From an API request to the engine's ``SamplingParams``, with the length checks."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.protocol import SamplingRequest
from octavo.sampling_params import RequestOutputKind, SamplingParams
from octavo.structured_output.params import StructuredOutputsParams

# Request fields copied to SamplingParams when the client set them (None = engine default).
_OPTIONAL_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
)
_SAMPLING_FIELDS = frozenset(field.name for field in dataclasses.fields(SamplingParams))
_LEADING_NAME = re.compile(r"\w+")
_PLAIN_FIELDS = (
    "n",
    "stop",
    "stop_token_ids",
    "min_tokens",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "cache_salt",
    "kv_transfer_params",
    "stream_interval",
)


def resolve_max_tokens(
    requested: int | None,
    num_prompt_tokens: int,
    max_model_len: int,
    default: int | None,
    prompt_param: str,
) -> int:
    """The number of tokens to generate; 400 if the prompt leaves too little room.

    ``default=None`` means "as many as fit" (chat); completions default to 16 like
    OpenAI, clamped to what fits when the client did not ask for a number.
    """
    room = max_model_len - num_prompt_tokens
    if room <= 0:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt "
            f"has {num_prompt_tokens} tokens, leaving no room to generate.",
            param=prompt_param,
        )
    if requested is None:
        return room if default is None else min(default, room)
    if num_prompt_tokens + requested > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the "
            f"prompt, {requested} for the completion). Please reduce the prompt or max_tokens.",
            param="max_tokens",
        )
    return requested


def to_sampling_params(
    request: SamplingRequest,
    max_tokens: int,
    logprobs: int | None,
    constraint: StructuredOutputsParams | None = None,
    prompt_logprobs: int | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> SamplingParams:
    """Build the engine's parameters; the engine's own checks become HTTP 400s.

    ``defaults`` (``--generation-config``) fill the sampling fields the client left out.
    """
    values = {name: getattr(request, name) for name in _PLAIN_FIELDS}
    values["prompt_logprobs"] = prompt_logprobs
    values["structured_outputs"] = constraint
    for name in _OPTIONAL_FIELDS:
        value = getattr(request, name)
        if value is None and defaults:
            value = defaults.get(name)
        if value is not None:
            values[name] = value
    try:
        return SamplingParams(
            **values, max_tokens=max_tokens, logprobs=logprobs, output_kind=RequestOutputKind.DELTA
        )
    except ValueError as error:
        raise bad_request(str(error), param=refused_field(str(error))) from None


def refused_field(message: str, default: str | None = None) -> str | None:
    """The request field a ``SamplingParams`` or engine refusal is about: the sampling
    field its message starts with ("stop_token_ids must be ...", "n=3 ..."), else
    ``default``."""
    match = _LEADING_NAME.match(message)
    name = match.group() if match else None
    return name if name in _SAMPLING_FIELDS else default


def with_transfer_params(body: dict[str, Any], finals: list[Any]) -> dict[str, Any]:
    """A response's JSON with a prefill's ``kv_transfer_params`` at the top level, where
    vLLM puts it (the routing sidecar reads it from there); unchanged without one."""
    for final in finals:
        if final.kv_transfer_params is not None:
            return {**body, "kv_transfer_params": final.kv_transfer_params}
    return body
