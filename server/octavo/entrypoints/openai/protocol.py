"""Request bodies of the OpenAI-compatible API (pydantic models).

Unknown fields are rejected (HTTP 400) rather than silently ignored; a few fields that
OpenAI clients send but that do not change generation (``user``, ``metadata``, ...) are
accepted. Features the engine does not have (logit bias, audio, ...) are refused with a
message naming the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from octavo.sampling_params import MAX_CACHE_SALT_LENGTH

MAX_REQUEST_ID_LENGTH = 200
# What the server itself hands the chat template (chat_template_kwargs may not set it).
CHAT_TEMPLATE_ARGUMENTS = frozenset(
    [
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "return_dict",
        "return_tensors",
        "tokenizer_kwargs",
        "padding",
        "truncation",
        "max_length",
    ]
)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# JSON may carry "\ud800" escapes that decode to lone UTF-16 surrogates: Python strings,
# but not Unicode text (the tokenizer and the UTF-8 encoder both choke on them).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_path(value: Any) -> str | None:
    """Where the first string (or key) holding a lone surrogate sits in decoded JSON."""
    if isinstance(value, str):
        return "body" if _LONE_SURROGATE.search(value) else None
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:  # iterative: the JSON may be nested as deep as the parser allows
        path, item = pending.pop()
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            continue
        for key, child in children:
            if isinstance(key, str) and _LONE_SURROGATE.search(key):
                return f"{path or 'body'} (a field name)"
            if isinstance(child, str) and _LONE_SURROGATE.search(child):
                return _join(path, key)
            if isinstance(child, dict | list):
                pending.append((_join(path, key), child))
    return None


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


class RequestBody(StrictModel):
    """A whole request body: refuses text that is not valid Unicode, wherever it is."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = lone_surrogate_path(data)
        if where is not None:
            raise ValueError(f"{where}: strings must be valid Unicode (lone surrogate escape)")
        return data


class RequestControls(RequestBody):
    """vLLM's ``priority`` and ``request_id``, checked alike on every endpoint that runs
    the engine (completions, chat, embeddings)."""

    priority: int = 0
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_LENGTH)

    @field_validator("priority")
    @classmethod
    def _no_priority_scheduling(cls, value: int) -> int:
        if value != 0:  # vLLM answers the same under its default fcfs policy
            raise ValueError(
                f"priority {value}: priority scheduling is not enabled (this server "
                "schedules first come, first served); send 0 or leave it out"
            )
        return value

    @field_validator("request_id")
    @classmethod
    def _printable_request_id(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise ValueError("request_id must be printable text")
        return value


class StreamOptions(StrictModel):
    include_usage: bool = False


class StructuredOutputsRequest(StrictModel):
    """vLLM's ``structured_outputs`` object: exactly one of these constrains the output."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        return super().model_dump(by_alias=True, **kwargs)


class SamplingRequest(RequestControls):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    # OpenAI's newer name (chat); completions take it too: the llm-d routing sidecar sets
    # both on its prefill requests
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Only requests with the same salt share prefix-cache blocks (vLLM's field).
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_LENGTH)
    # P/D disaggregation, vLLM's NixlConnector contract (checked in kv_transfer/params.py).
    kv_transfer_params: dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # tokens per streamed chunk, raising the server's --stream-interval (vLLM's field)
    stream_interval: int | None = Field(None, ge=1)
    logit_bias: dict[str, float] | None = None
    # Structured output (vLLM's extra parameters; see structured_outputs.py).
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # Accepted for compatibility; they do not change what is generated.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported by this server")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if any(stop == "" for stop in stops):
            raise ValueError("stop strings must not be empty")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        check_remote_decode_not_streamed(self.kv_transfer_params, self.stream)
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` wins over the older ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


PromptInput = str | list[str] | list[int] | list[list[int]]


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    )


def check_prompt_shape(value: Any, name: str = "prompt") -> PromptInput:
    """One of the four shapes of a prompt (token ids are integers, never booleans)."""
    if isinstance(value, str) or _is_token_ids(value):
        return value
    if isinstance(value, list) and (
        all(isinstance(item, str) for item in value) or all(_is_token_ids(i) for i in value)
    ):
        return value
    raise ValueError(
        f"{name} must be a string, a list of strings, a list of token ids or a list of "
        "token-id lists"
    )


def check_remote_decode_not_streamed(params: dict[str, Any] | None, stream: bool) -> None:
    """A prefill for a remote decode answers its ``kv_transfer_params`` in the response
    body (as vLLM, where the routing sidecar reads them): streamed, its blocks would stay
    held, unread, until the lease expired."""
    if stream and isinstance(params, dict) and params.get("do_remote_decode") is True:
        raise ValueError(
            "kv_transfer_params with do_remote_decode need stream false: the prefill's "
            "kv_transfer_params come back in the (non-streamed) response"
        )


def prompt_count(prompt: PromptInput) -> int:
    """How many prompts a completion's ``prompt`` holds."""
    return 1 if isinstance(prompt, str) or _is_token_ids(prompt) else len(prompt)


class CompletionRequest(SamplingRequest):
    prompt: Annotated[Any, AfterValidator(check_prompt_shape)]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0)  # at most --max-logprobs (checked when served)
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported by this server")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (it must be omitted or equal n)")
        if self.echo and self.logprobs is not None and self.stream:
            raise ValueError("echo with logprobs (prompt scoring) is supported without stream")
        if self.kv_transfer_params is not None and prompt_count(self.prompt) != 1:
            raise ValueError(
                "kv_transfer_params go with a single prompt (a prefill's KV blocks are one "
                "prompt's), got a list of several"
            )
        return self


class TextPart(StrictModel):
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> TextPart:
        if self.type != "text" or self.text is None:
            raise ValueError(
                f"only text and image_url content parts are supported, got type {self.type!r}"
            )
        return self


class ImageURL(StrictModel):
    url: str  # a data:image/...;base64 URL
    detail: str | None = None  # OpenAI's; the model's processor decides the resolution


class ImageURLPart(StrictModel):
    type: Literal["image_url"]
    image_url: ImageURL


class FunctionCall(StrictModel):
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it


class ToolCall(StrictModel):
    """A call the assistant made, sent back in the history."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ImageURLPart | TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call this is the result of
    # assistant messages: their reasoning, sent back (vLLM's fields; Harmony shows it)
    reasoning: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _tool_fields_fit_the_role(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool messages, and only they, need a tool_call_id")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(getattr(part, "text", None) or "" for part in self.content)
        return self.content or ""

    def has_images(self) -> bool:
        return isinstance(self.content, list) and any(
            isinstance(part, ImageURLPart) for part in self.content
        )


class JsonSchemaFormat(StrictModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_for_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("response_format json_schema goes with type 'json_schema' only")
        return self

    def constraint(self) -> dict[str, Any] | None:
        """As ``StructuredOutputsParams`` keywords (``None`` for plain text)."""
        if self.type == "json_object":
            return {"json_object": True}
        if self.type == "json_schema":
            return {"json": self.json_schema.schema_ or {}}
        return None


class FunctionDefinition(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments
    strict: bool | None = None


class ToolDefinition(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


_UNSUPPORTED_CHAT_FIELDS = ("functions", "function_call", "audio", "prediction")


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)  # at most --max-logprobs
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True  # --reasoning-parser: false drops the reasoning
    reasoning_effort: Literal["low", "medium", "high"] | None = None  # template kwarg
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    modalities: list[str] | None = None

    @field_validator(*_UNSUPPORTED_CHAT_FIELDS)
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(f"{info.field_name} is not supported by this server")
        return value

    @field_validator("tools")
    @classmethod
    def _distinct_tool_names(cls, tools: list[ToolDefinition] | None) -> Any:
        names = [tool.function.name for tool in tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools must have distinct function names")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_fits_the_tools(cls, choice: Any, info: ValidationInfo) -> Any:
        names = [tool.function.name for tool in info.data.get("tools") or []]
        if choice not in (None, "none") and not names:
            raise ValueError("tool_choice needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(
                f"tool_choice names the function {choice.function.name!r}, which is not "
                f"among the tools ({', '.join(names)})"
            )
        return choice

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs_are_extra(cls, value: dict[str, Any] | None) -> Any:
        taken = sorted(set(value or {}) & CHAT_TEMPLATE_ARGUMENTS)
        if taken:
            raise ValueError(
                f"chat_template_kwargs may not set {', '.join(taken)} (the request's own "
                "fields set those)"
            )
        return value

    @field_validator("modalities")
    @classmethod
    def _text_modality(cls, value: list[str] | None) -> list[str] | None:
        if value not in (None, ["text"]):
            raise ValueError("only the 'text' modality is supported")
        return value

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "continue_final_message goes with add_generation_prompt false (the last "
                "message is continued, no new one is started)"
            )
        return self


class TokenizeRequest(RequestBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[int]
