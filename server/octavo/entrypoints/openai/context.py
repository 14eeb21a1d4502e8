"""What every route needs: the server's settings, the engine and the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from octavo.config import DEFAULT_MAX_LOGPROBS
from octavo.engine.async_engine import AsyncEngine
from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.adapters import ServedAdapters
from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.entrypoints.openai.logprobs_format import TokenDecoder
from octavo.entrypoints.openai.metrics import ServerMetrics
from octavo.entrypoints.openai.structured_outputs import GrammarChecker
from octavo.entrypoints.openai.tokenizer_pool import TokenizerPool
from octavo.lora_request import LoRARequest

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_LIMIT_CONCURRENCY = 512
DEFAULT_HEADER_TIMEOUT = 10.0


@dataclass
class ServerConfig:
    """HTTP-level settings (the engine's own settings live in ``EngineArgs``)."""

    served_model_names: list[str]
    model_root: str  # what the model was loaded from, shown by /v1/models
    api_key: str | None = None
    max_queue_len: int | None = None
    shutdown_timeout: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_sequences_per_request: int | None = None  # None: derived from the KV cache
    limit_concurrency: int = DEFAULT_LIMIT_CONCURRENCY
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None  # a name in tool_calls.parsers.TOOL_CALL_PARSERS
    tool_prompt_fallback: bool = True  # tools as text for templates that never use them
    reasoning_parser: str | None = None  # a name in reasoning.parsers.REASONING_PARSERS
    default_chat_template_kwargs: dict[str, Any] | None = None  # under each request's own
    allow_runtime_lora_updating: bool = False  # the load/unload adapter routes
    lora_allowed_roots: list[str] | None = None  # folders run-time adapter loads may read
    chat_template: str | None = None  # --chat-template's text (None: the tokenizer's)
    response_role: str = "assistant"
    return_tokens_as_token_ids: bool = False
    enable_prompt_tokens_details: bool = False
    enable_log_requests: bool = False
    otlp_traces_endpoint: str | None = None  # an OTLP collector: a span per request
    disable_web_ui: bool = False  # no page at / (web_routes.py)
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # EngineArgs.max_logprobs
    # --generation-config: defaults for the sampling fields a request leaves out
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        """The name responses report in their ``model`` field."""
        return self.served_model_names[0]


@dataclass
class ServerContext:
    config: ServerConfig
    engine: AsyncEngine
    metrics: ServerMetrics
    tokenizers: TokenizerPool = field(default_factory=TokenizerPool)
    grammars: GrammarChecker = field(default_factory=GrammarChecker)
    _decoder: TokenDecoder | None = field(default=None, repr=False)
    _adapters: ServedAdapters | None = field(default=None, repr=False)

    def check_model(self, model: str | None) -> LoRARequest | None:
        """A request may omit ``model``; if it names one, it must be a served name (None:
        the base model) or a served LoRA adapter's (its ``LoRARequest``); else 404."""
        if model is None or model in self.config.served_model_names:
            return None
        if self.engine.info is None:  # adapters are known once the engine has loaded
            self.engine.check_available()
        adapter = self.adapters().by_name.get(model)
        if adapter is not None:
            return adapter
        # Only the name the caller sent: the served names and adapters are GET /v1/models'
        # to tell (behind the API key when there is one), as in vLLM.
        raise APIError(
            404,
            f"The model `{model}` does not exist.",
            type="invalid_request_error",
            param="model",
            code="model_not_found",
        )

    def response_model(self, model: str | None) -> str:
        """What a response reports in ``model``: the adapter's name, else the first name."""
        if model is not None and self.engine.info is not None and model in self.adapters().by_name:
            return model
        return self.config.model_name

    def adapters(self) -> ServedAdapters:
        """The served LoRA adapters (none before the engine has loaded)."""
        if self._adapters is None:
            if self.engine.info is None:
                return ServedAdapters(False, {}, 1)
            self._adapters = ServedAdapters.from_info(self.engine.info)
        return self._adapters

    def ready_info(self) -> EngineInfo:
        """The loaded engine's facts, or a 503 while loading/draining/dead."""
        self.engine.check_available()
        info = self.engine.info
        assert info is not None  # check_available guarantees a loaded engine
        return info

    def check_fan_out(self, count: int, info: EngineInfo, param: str) -> None:
        """400 when one request asks for more sequences (prompts × n) than allowed."""
        limit = self.config.max_sequences_per_request or info.default_max_sequences_per_request
        if count > limit:
            raise bad_request(
                f"this request asks for {count} sequences (prompts × n); the limit is "
                f"{limit} per request (--max-sequences-per-request)",
                param=param,
            )

    def check_logprobs(self, count: int | None, param: str) -> None:
        """400 when a request asks for more logprobs than ``--max-logprobs``, as vLLM."""
        if count is not None and count > self.config.max_logprobs:
            raise bad_request(
                f"Requested {param} of {count}, which is greater than max allowed: "
                f"{self.config.max_logprobs} (--max-logprobs)",
                param=param,
            )

    def decoder(self) -> TokenDecoder:
        """The (cached) token-text decoder of the loaded engine's tokenizer."""
        if self._decoder is None:
            assert self.engine.info is not None, "the engine is not loaded"
            kind = TokenIdDecoder if self.config.return_tokens_as_token_ids else TokenDecoder
            self._decoder = kind(self.engine.info.tokenizer)
        return self._decoder


class TokenIdDecoder(TokenDecoder):
    """``--return-tokens-as-token-ids``: logprobs name each token ``token_id:N`` (as vLLM,
    text offsets count these labels); ``bytes`` stay the token's real UTF-8 bytes."""

    def text(self, token_id: int) -> str:
        return f"token_id:{token_id}"


def get_context(request: Request) -> ServerContext:
    """FastAPI dependency: the context stored on the application."""
    return request.app.state.octavo
