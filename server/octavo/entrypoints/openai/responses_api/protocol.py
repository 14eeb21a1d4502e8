"""The body of ``POST /v1/responses`` (pydantic).

Unknown fields are refused (HTTP 400), as for the other endpoints. ``input`` items,
``tools``, ``tool_choice`` and ``text`` are kept as JSON here and read in
``conversion.py``, which names the exact offending field (``input[2].type``) in its 400s.
Fields OpenAI clients send that do not change generation here are accepted.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from octavo.entrypoints.openai.protocol import MAX_REQUEST_ID_LENGTH, RequestBody
from octavo.sampling_params import MAX_CACHE_SALT_LENGTH

JsonObject = dict[str, Any]


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
    background: bool | None = None
    # Accepted for compatibility; they do not change what is generated.
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

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
