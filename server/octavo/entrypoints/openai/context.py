"""What every route needs: the server's settings, the engine and the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from octavo.entrypoints.openai.async_engine import AsyncEngine, EngineInfo
from octavo.entrypoints.openai.errors import APIError
from octavo.entrypoints.openai.logprobs import TokenDecoder
from octavo.entrypoints.openai.metrics import ServerMetrics

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass
class ServerConfig:
    """HTTP-level settings (the engine's own settings live in ``EngineArgs``)."""

    served_model_names: list[str]
    model_root: str  # what the model was loaded from, shown by /v1/models
    api_key: str | None = None
    max_queue_len: int | None = None
    shutdown_timeout: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @property
    def model_name(self) -> str:
        """The name responses report in their ``model`` field."""
        return self.served_model_names[0]


@dataclass
class ServerContext:
    config: ServerConfig
    engine: AsyncEngine
    metrics: ServerMetrics
    _decoder: TokenDecoder | None = field(default=None, repr=False)

    def check_model(self, model: str | None) -> None:
        """A request may omit ``model``; if it names one, it must be a served name."""
        if model is not None and model not in self.config.served_model_names:
            raise APIError(
                404,
                f"The model '{model}' does not exist; this server serves "
                f"{', '.join(repr(name) for name in self.config.served_model_names)}.",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )

    def ready_info(self) -> EngineInfo:
        """The loaded engine's facts, or a 503 while loading/draining/dead."""
        self.engine.check_available()
        info = self.engine.info
        assert info is not None  # check_available guarantees a loaded engine
        return info

    def decoder(self) -> TokenDecoder:
        """The (cached) token-text decoder of the loaded engine's tokenizer."""
        if self._decoder is None:
            assert self.engine.info is not None, "the engine is not loaded"
            self._decoder = TokenDecoder(self.engine.info.tokenizer)
        return self._decoder


def get_context(request: Request) -> ServerContext:
    """FastAPI dependency: the context stored on the application."""
    return request.app.state.octavo
