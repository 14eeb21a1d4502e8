"""The body of ``POST /v1/responses`` (pydantic).

Unknown fields are refused (HTTP 400), as for the other endpoints. ``input`` items,
``tools``, ``tool_choice`` and ``text`` are kept as JSON here and read in
``conversion.py``, which names the exact offending field (``input[2].type``) in its 400s.
Fields OpenAI clients send that do not change generation here are accepted, within
OpenAI's bounds (a stored response echoes them): ``metadata`` at most 16 pairs of keys up
to 64 and values up to 512 characters, ``user`` and the identifiers bounded, and only
OpenAI's keys in ``text`` and ``reasoning``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from octavo.entrypoints.openai.protocol import (
    MAX_REQUEST_ID_LENGTH,
    RequestBody,
    check_remote_decode_not_streamed,
)
from octavo.sampling_params import MAX_CACHE_SALT_LENGTH

JsonObject = dict[str, Any]
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_USER_CHARS = 256
MAX_IDENTIFIER_CHARS = 64  # safety_identifier, prompt_cache_key (OpenAI's bound)
TEXT_KEYS = frozenset(["format", "verbosity"])
FORMAT_KEYS = frozenset(["type", "name", "description", "schema", "strict"])
VERBOSITY = ("low", "medium", "high")
REASONING_CHOICES = {  # OpenAI's reasoning keys and the values each takes (None: unset)
    "effort": ("none", "minimal", "low", "medium", "high", "xhigh", None),
    "summary": ("auto", "concise", "detailed", None),
    "generate_summary": ("auto", "concise", "detailed", None),
}


class ResponsesRequest(RequestBody):
    model: str | None = None
    input: Any  # a string or a list of items (checked below)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None  # vLLM's extra sampling field
    text: JsonObject | None = None
    tools: list[JsonObject] | None = None
    tool_choice: Any = None  # a mode or an object (read in request_options.py)
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    store: bool = True
    stream: bool = False
    stream_options: JsonObject | None = None
    reasoning: JsonObject | None = None
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_LENGTH)
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_LENGTH)
    kv_transfer_params: JsonObject | None = None  # P/D disaggregation (vLLM's contract)
    background: bool | None = None
    # Accepted for compatibility; they do not change what is generated.
    metadata: dict[str, str] | None = None
    user: str | None = Field(None, max_length=MAX_USER_CHARS)
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = Field(None, max_length=MAX_IDENTIFIER_CHARS)
    safety_identifier: str | None = Field(None, max_length=MAX_IDENTIFIER_CHARS)

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        pairs = value or {}
        if len(pairs) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} pairs, got {len(pairs)}")
        for key, text in pairs.items():
            if len(key) > MAX_METADATA_KEY_CHARS:
                raise ValueError(f"keys are at most {MAX_METADATA_KEY_CHARS} characters")
            if len(text) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"values are at most {MAX_METADATA_VALUE_CHARS} characters")
        return value

    @field_validator("text")
    @classmethod
    def _known_text_keys(cls, value: JsonObject | None) -> JsonObject | None:
        if value is None:
            return None
        _only_keys(value, TEXT_KEYS, "text")
        spec = value.get("format")
        if isinstance(spec, dict):
            _only_keys(spec, FORMAT_KEYS, "text.format")
        if value.get("verbosity") not in (*VERBOSITY, None):
            raise ValueError(f"text.verbosity must be one of {', '.join(VERBOSITY)}")
        return value

    @model_validator(mode="after")
    def _remote_decode_not_streamed(self) -> ResponsesRequest:
        check_remote_decode_not_streamed(self.kv_transfer_params, self.stream)
        return self

    @field_validator("reasoning")
    @classmethod
    def _known_reasoning(cls, value: JsonObject | None) -> JsonObject | None:
        if value is None:
            return None
        _only_keys(value, frozenset(REASONING_CHOICES), "reasoning")
        for key, choices in REASONING_CHOICES.items():
            if value.get(key) not in choices:
                known = ", ".join(choice for choice in choices if choice is not None)
                raise ValueError(f"reasoning.{key} must be one of {known}")
        return value

    @field_validator("background")
    @classmethod
    def _no_background(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("background responses are not supported by this server")
        return value

    @field_validator("input")
    @classmethod
    def _text_or_items(cls, value: Any) -> str | list[JsonObject]:
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise ValueError("input must be a string or a list of input items (JSON objects)")
        if not value:
            raise ValueError("input must hold at least one item")
        return value


def _only_keys(value: JsonObject, known: frozenset[str], where: str) -> None:
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; known: {', '.join(sorted(known))}")
