"""Assembling the FastAPI application around an engine factory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

import octavo
from octavo.engine.async_engine import AsyncEngine, EngineCore
from octavo.entrypoints.openai import lora_routes, ops_routes, routes
from octavo.entrypoints.openai.auth import ApiKeyMiddleware
from octavo.entrypoints.openai.context import ServerConfig, ServerContext
from octavo.entrypoints.openai.errors import install_error_handlers
from octavo.entrypoints.openai.metrics import ServerMetrics
from octavo.entrypoints.openai.middleware import (
    BodySizeLimitMiddleware,
    ConcurrencyLimitMiddleware,
    RequestIdMiddleware,
)
from octavo.entrypoints.openai.tokenizer_pool import TokenizerPool

logger = logging.getLogger(__name__)


def build_app(
    config: ServerConfig,
    core: EngineCore,
    on_load_failure: Callable[[], None] | None = None,
    on_death: Callable[[], None] | None = None,
) -> FastAPI:
    """The app; its lifespan starts the engine core, which loads the model.

    The port therefore answers (``/health`` 503) while the model loads.
    """
    metrics = ServerMetrics(config.model_name)
    engine = AsyncEngine(
        core,
        max_queue_len=config.max_queue_len,
        on_step=metrics.on_step,
        on_load_failure=on_load_failure,
        on_death=on_death,
    )
    tokenizers = TokenizerPool()
    context = ServerContext(config=config, engine=engine, metrics=metrics, tokenizers=tokenizers)
    lifespan = _lifespan(engine, [tokenizers, context.grammars])
    app = FastAPI(title="Octavo", version=octavo.__version__, lifespan=lifespan)
    app.state.octavo = context
    install_error_handlers(app)
    app.include_router(routes.router)
    app.include_router(ops_routes.router)
    if config.allow_runtime_lora_updating:  # as vLLM: without the opt-in, no such routes
        logger.warning("LoRA adapters may be loaded and unloaded at run time "
                       "(/v1/load_lora_adapter, /v1/unload_lora_adapter)")  # fmt: skip
        app.include_router(lora_routes.router)
    # add_middleware puts each new one outermost: request ids wrap everything.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(ConcurrencyLimitMiddleware, limit=config.limit_concurrency)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.add_middleware(RequestIdMiddleware)
    return app


def _lifespan(engine: AsyncEngine, pools: list) -> Callable[[FastAPI], Any]:
    """Start the engine; at the end abort what is left, drop queued tokenizing and grammar
    work (``pools``: each has ``shutdown()``), and stop the engine."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            engine.abort_all()
            for pool in pools:
                pool.shutdown()
            await asyncio.to_thread(engine.stop)

    return lifespan


def context_of(app: FastAPI) -> ServerContext:
    """The server context of an app made by ``build_app`` (handy for tests and tools)."""
    return app.state.octavo
