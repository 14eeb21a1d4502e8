"""Running an app on a real uvicorn server in a background thread (tests and tools).

The server listens on a free loopback port; signals are left alone (uvicorn only
installs handlers on the main thread).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import uvicorn
from fastapi import FastAPI

from octavo.config import EngineArgs
from octavo.entrypoints.openai.app import build_app, context_of
from octavo.entrypoints.openai.context import ServerConfig

LOOPBACK = "127.0.0.1"


def build_local_app(
    model: str,
    config: ServerConfig | None = None,
    on_engine: Callable[[Any], None] | None = None,
    **engine_kwargs: Any,
) -> FastAPI:
    """An app serving the model folder ``model`` with ``EngineArgs(**engine_kwargs)``.

    ``on_engine`` is called on the engine thread with the freshly built ``LLMEngine``
    (tests use it to reach the engine's internals or to wrap its methods).
    """
    from octavo.engine.llm_engine import LLMEngine

    def factory() -> LLMEngine:
        engine = LLMEngine(EngineArgs(model=model, **engine_kwargs))
        if on_engine is not None:
            on_engine(engine)
        return engine

    config = config or ServerConfig(served_model_names=[model], model_root=model)
    return build_app(config, factory)


class ThreadedServer:
    """``with ThreadedServer(app) as server: httpx.get(server.url + "/health")``."""

    def __init__(self, app: FastAPI, startup_timeout: float = 30.0) -> None:
        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((LOOPBACK, 0))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        self._startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        self._wait(lambda: self.server.started, "the server did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()

    def wait_ready(self) -> ThreadedServer:
        """Block until the engine has loaded (or raise if it failed)."""
        engine = context_of(self.app).engine
        self._wait(lambda: engine.is_ready or engine.status == "failed", "engine not ready")
        if not engine.is_ready:
            raise RuntimeError(f"the engine did not load ({engine.status})")
        return self

    def _wait(self, condition: Callable[[], bool], message: str) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(message)
            time.sleep(0.02)
