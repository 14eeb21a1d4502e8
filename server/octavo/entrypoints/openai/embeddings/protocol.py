"""The embeddings request and response bodies (OpenAI's, with vLLM's extra fields)."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field

from octavo.entrypoints.openai.protocol import StrictModel

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(StrictModel):
    input: EmbeddingInput
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None  # accepted, as OpenAI clients send it
    # vLLM's extras
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)  # -1: max_model_len
    add_special_tokens: bool = True
    normalize: bool | None = None  # None: the model's default
    request_id: str | None = None
    priority: int = 0  # accepted for vLLM's clients; Octavo schedules first come, first served


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
