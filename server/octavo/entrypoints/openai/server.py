"""Running the app on uvicorn: the port opens first, the engine loads behind it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import disable_created_metrics

from octavo.config import EngineArgs
from octavo.engine.core_process import ProcessCore
from octavo.entrypoints.openai.app import build_app, context_of
from octavo.entrypoints.openai.context import ServerConfig
from octavo.entrypoints.openai.shutdown import DrainingServer
from octavo.entrypoints.openai.uvicorn_config import uvicorn_config

logger = logging.getLogger(__name__)

LOAD_FAILURE_EXIT_CODE = 1
ENGINE_DEATH_EXIT_CODE = 2
GRACEFUL_CLOSE_SECONDS = 5  # uvicorn's wait for open connections once draining is done


@dataclass
class ListenArgs:
    host: str
    port: int
    log_level: str = "info"


def run_server(
    config: ServerConfig, engine_args: EngineArgs, listen: ListenArgs, render_only: bool = False
) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code.

    The engine core runs in its own process; if it dies, ``/health`` turns 503 and the
    server exits with ``ENGINE_DEATH_EXIT_CODE`` so the pod is restarted. ``render_only``
    (``octavo launch render``): the core loads the tokenizer alone, and only the render
    endpoints, /v1/models and the operational routes are served.
    """
    disable_created_metrics()  # like vLLM: no *_created series in the scrape
    holder: list[DrainingServer] = []
    core = _render_core(engine_args) if render_only else ProcessCore(engine_args)
    app = build_app(
        config,
        core,
        on_load_failure=lambda: holder[0].fail(LOAD_FAILURE_EXIT_CODE),
        on_death=lambda: holder[0].fail(ENGINE_DEATH_EXIT_CODE),
        warm_grammar_compiler=not render_only,
        render_only=render_only,
    )
    uv_config = uvicorn_config(
        app,
        config,
        host=listen.host,
        port=listen.port,
        log_level=listen.log_level.lower(),
        timeout_graceful_shutdown=GRACEFUL_CLOSE_SECONDS,
        lifespan="on",
    )
    context = context_of(app)
    server = DrainingServer(uv_config, context.engine, config.shutdown_timeout, context.grammars)
    holder.append(server)
    logger.info("serving %s on http://%s:%d", config.model_name, listen.host, listen.port)
    server.run()
    if server.exit_code == LOAD_FAILURE_EXIT_CODE:
        logger.error("exiting: the engine failed to load")
    elif server.exit_code == ENGINE_DEATH_EXIT_CODE:
        logger.error("exiting: the engine core died")
    return server.exit_code


def _render_core(engine_args: EngineArgs):
    """The tokenizer-only core of ``octavo launch render`` (imported here: it loads the
    tokenizer in this process, which a served engine's API process leaves to the core)."""
    from octavo.entrypoints.openai.render_server import TokenizerCore

    return TokenizerCore(engine_args)
