"""Response bodies of the OpenAI-compatible API (pydantic models)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer


def _now() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens found in the prefix cache


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None  # --enable-prompt-tokens-details

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached: int | None = None) -> Usage:
        """``cached``: prompt tokens served from the prefix cache (None: not reported)."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=None
            if cached is None
            else PromptTokensDetails(cached_tokens=cached),
        )

    @model_serializer(mode="wrap")
    def _details_only_when_reported(self, handler: Any) -> dict[str, Any]:
        body = handler(self)
        if body.get("prompt_tokens_details") is None:
            body.pop("prompt_tokens_details", None)
        return body


# ----- /v1/completions -----------------------------------------------------------------
class CompletionLogprobs(BaseModel):
    """The legacy completions logprobs format."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)

    def followed_by(self, other: CompletionLogprobs) -> CompletionLogprobs:
        """These entries, then ``other``'s (an echoed prompt's, then the completion's)."""
        return CompletionLogprobs(
            tokens=self.tokens + other.tokens,
            token_logprobs=self.token_logprobs + other.token_logprobs,
            top_logprobs=self.top_logprobs + other.top_logprobs,
            text_offset=self.text_offset + other.text_offset,
        )


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# ----- /v1/chat/completions ------------------------------------------------------------
REASONING_FIELDS = ("reasoning", "reasoning_content")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: str = "assistant"  # --response-role
    content: str | None = None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    # --reasoning-parser: the thinking, under vLLM's name and its older one (both sent)
    reasoning: str | None = None
    reasoning_content: str | None = None

    @classmethod
    def with_reasoning(cls, reasoning: str | None, **fields: Any) -> AssistantMessage:
        return cls(reasoning=reasoning, reasoning_content=reasoning, **fields)

    @model_serializer(mode="wrap")
    def _reasoning_only_when_there(self, handler: Any) -> dict[str, Any]:
        body = handler(self)
        for key in REASONING_FIELDS:
            if body.get(key) is None:
                body.pop(key, None)
        return body


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class _DropUnset(BaseModel):
    """Fields left ``None`` are left out, as in OpenAI's stream chunks."""

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class DeltaFunction(_DropUnset):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_DropUnset):
    """A piece of a streamed tool call: the first carries id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class DeltaMessage(_DropUnset):
    """A streamed piece of the assistant message; absent fields are left out."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None  # --reasoning-parser (reasoning_content: the older name)
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    def with_reasoning(self, reasoning: str | None) -> DeltaMessage:
        """This piece, carrying ``reasoning`` too (itself when there is none)."""
        if reasoning is None:
            return self
        return self.model_copy(update={"reasoning": reasoning, "reasoning_content": reasoning})


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# ----- models, tokenizer, version -------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "octavo"
    root: str
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


class HealthResponse(BaseModel):
    status: str
