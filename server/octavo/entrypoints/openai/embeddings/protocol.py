"""The embeddings request and response bodies (OpenAI's, with vLLM's extra fields)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from octavo.entrypoints.openai.protocol import RequestControls, check_prompt_shape


def _check_input_shape(value: Any) -> Any:
    return check_prompt_shape(value, "input")


class EmbeddingRequest(RequestControls):
    """``request_id`` and ``priority`` are checked as on the other endpoints."""

    input: Annotated[Any, AfterValidator(_check_input_shape)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None  # accepted, as OpenAI clients send it
    # vLLM's extras
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)  # -1: max_model_len
    add_special_tokens: bool = True
    normalize: bool | None = None  # None: the model's default


class EmbeddingData(BaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str  # floats, or base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0  # as vLLM reports it


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage
