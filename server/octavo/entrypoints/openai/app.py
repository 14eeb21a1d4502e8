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
from octavo.entrypoints.openai import (
    embedding_routes,
    lora_routes,
    ops_routes,
    responses_routes,
    routes,
    scoring_routes,
    web_routes,
)
from octavo.entrypoints.openai.auth import ApiKeyMiddleware
from octavo.entrypoints.openai.context import ServerConfig, ServerContext
from octavo.entrypoints.openai.errors import install_error_handlers
from octavo.entrypoints.openai.grammar_warm_up import warm_up_structured_output
from octavo.entrypoints.openai.metrics import ServerMetrics
from octavo.entrypoints.openai.middleware import (
    BodySizeLimitMiddleware,
    ConcurrencyLimitMiddleware,
    RequestIdMiddleware,
)
from octavo.entrypoints.openai.structured_outputs import GrammarChecker
from octavo.entrypoints.openai.tokenizer_pool import TokenizerPool
from octavo.tracing import RequestTracer, TraceContextMiddleware

logger = logging.getLogger(__name__)

READY_POLL_SECONDS = 0.2  # how soon after the engine is ready the grammar compiler starts


def build_app(
    config: ServerConfig,
    core: EngineCore,
    on_load_failure: Callable[[], None] | None = None,
    on_death: Callable[[], None] | None = None,
    warm_grammar_compiler: bool = False,
    render_only: bool = False,
) -> FastAPI:
    """The app; its lifespan starts the engine core, which loads the model.

    The port therefore answers (``/health`` 503) while the model loads. ``render_only``
    (``octavo launch render``, whose core loads only the tokenizer): no generation
    routes, only the render endpoints, /v1/models and the operational routes. With
    ``warm_grammar_compiler`` (the served app; tests' servers leave it off to spare their
    CPU) structured output is warmed up once the engine is ready, before ``/health`` says
    200 (``grammar_warm_up.py``), so the first constrained request does not wait seconds.
    """
    context = _server_context(config, core, on_load_failure, on_death)
    context.grammars.warming = warm_grammar_compiler  # /health waits for the warm-up
    tracer = None  # --otlp-traces-endpoint: a span per generation request
    if config.otlp_traces_endpoint and not render_only:
        tracer = RequestTracer.start(config.otlp_traces_endpoint, config.model_name)
    pools = [context.tokenizers, context.grammars]
    warm = context.grammars if warm_grammar_compiler else None
    lifespan = _lifespan(context.engine, pools, warm, tracer)
    app = FastAPI(title="Octavo", version=octavo.__version__, lifespan=lifespan)
    app.state.octavo = context
    install_error_handlers(app)
    _include_routes(app, config, render_only)
    _add_middleware(app, config, tracer)
    return app


def _server_context(
    config: ServerConfig,
    core: EngineCore,
    on_load_failure: Callable[[], None] | None,
    on_death: Callable[[], None] | None,
) -> ServerContext:
    """The engine over ``core``, its metrics and the tokenizer pool, as the routes see them."""
    metrics = ServerMetrics(config.model_name)
    engine = AsyncEngine(
        core,
        max_queue_len=config.max_queue_len,
        on_step=metrics.on_step,
        on_load_failure=on_load_failure,
        on_death=on_death,
    )
    metrics.engine_stats.engine_info = lambda: engine.info
    tokenizers = TokenizerPool()
    context = ServerContext(config=config, engine=engine, metrics=metrics, tokenizers=tokenizers)
    metrics.watch_compiling(lambda: context.grammars.in_flight)
    return context


def _include_routes(app: FastAPI, config: ServerConfig, render_only: bool) -> None:
    """Render, models and operational routes always; generation, responses, pooling and
    scoring unless ``render_only``; adapter loading only with its opt-in (as vLLM)."""
    for router in (routes.render_router, routes.models_router, ops_routes.router):
        app.include_router(router)
    if render_only:
        return
    for router in (
        routes.router,
        responses_routes.router,
        embedding_routes.router,
        scoring_routes.router,
    ):
        app.include_router(router)
    if config.allow_runtime_lora_updating:
        logger.warning(
            "LoRA adapters may be loaded and unloaded at run time "
            "(/v1/load_lora_adapter, /v1/unload_lora_adapter)"
        )
        app.include_router(lora_routes.router)


def _add_middleware(app: FastAPI, config: ServerConfig, tracer: RequestTracer | None) -> None:
    """add_middleware puts each new one outermost: request ids wrap everything."""
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(ConcurrencyLimitMiddleware, limit=config.limit_concurrency)
    if tracer is not None:
        app.add_middleware(TraceContextMiddleware, tracer=tracer)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    web_routes.install(app, config)  # outside the key check: the page asks for the key
    app.add_middleware(RequestIdMiddleware)


def _lifespan(
    engine: AsyncEngine,
    pools: list,
    grammars: GrammarChecker | None = None,
    tracer: RequestTracer | None = None,
) -> Callable[[FastAPI], Any]:
    """Start the engine (and ``grammars``' compile processes once it is ready); at the end
    abort what is left, drop queued tokenizing and grammar work (``pools``: each has
    ``shutdown()``), stop the engine, and send the spans ``tracer`` still holds."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start(asyncio.get_running_loop())
        warming = (
            None if grammars is None else asyncio.create_task(warm_when_ready(engine, grammars))
        )
        try:
            yield
        finally:
            if warming is not None:
                warming.cancel()
            engine.abort_all()
            for pool in pools:
                pool.shutdown()
            await asyncio.to_thread(engine.stop)
            if tracer is not None:
                await asyncio.to_thread(tracer.shutdown)

    return lifespan


async def warm_when_ready(engine: AsyncEngine, grammars: GrammarChecker) -> None:
    """Once the engine has loaded, warm structured output up (``grammar_warm_up.py``):
    ``/health`` says 200 once done (ready means ready; shutdown does not wait for it);
    nothing if the engine failed to load."""
    try:
        while engine.status == "loading":
            await asyncio.sleep(READY_POLL_SECONDS)
        if engine.status == "ready" and engine.info is not None:
            await warm_up_structured_output(engine, grammars)
    finally:
        grammars.warming = False


def context_of(app: FastAPI) -> ServerContext:
    """The server context of an app made by ``build_app`` (handy for tests and tools)."""
    return app.state.octavo
