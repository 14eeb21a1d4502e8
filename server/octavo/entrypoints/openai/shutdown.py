"""Graceful shutdown: on SIGTERM stop admitting, finish in-flight requests, then exit.

uvicorn's own handler closes the listening socket at once; we keep the port open so
/health can answer 503 while requests drain, and only then let uvicorn shut down.
In flight: the engine's requests and those waiting for their constraint to compile (which
end at their compile deadline; past the drain's, their compiles are stopped and they
answer 503 in OpenAI's error shape). A second signal exits immediately.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn

from octavo.engine.async_engine import AsyncEngine
from octavo.entrypoints.openai.structured_outputs import GrammarChecker

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
ABORT_GRACE_SECONDS = 5.0  # after aborting leftovers, time for their responses to end


async def drain(
    engine: AsyncEngine, timeout: float, grammars: GrammarChecker | None = None
) -> None:
    """Refuse new requests, wait up to ``timeout`` s for open ones (those compiling their
    constraint included), abort the rest."""
    engine.start_draining()
    in_flight = _in_flight(engine, grammars)
    logger.info("draining: %d requests in flight, waiting up to %.1fs", in_flight, timeout)
    if not await _wait_until_idle(engine, grammars, timeout):
        logger.warning("shutdown timeout: aborting %d requests", _in_flight(engine, grammars))
        engine.abort_all()
        if grammars is not None:
            grammars.shutdown()  # the compiles' callers answer 503 (JSON)
        await _wait_until_idle(engine, grammars, ABORT_GRACE_SECONDS)


def _in_flight(engine: AsyncEngine, grammars: GrammarChecker | None) -> int:
    return engine.num_open + (0 if grammars is None else grammars.in_flight)


async def _wait_until_idle(
    engine: AsyncEngine, grammars: GrammarChecker | None, timeout: float
) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while _in_flight(engine, grammars) and loop.time() < deadline:
        await asyncio.sleep(POLL_SECONDS)
    return _in_flight(engine, grammars) == 0


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains instead of closing the port."""

    def __init__(
        self,
        config: uvicorn.Config,
        engine: AsyncEngine,
        timeout: float,
        grammars: GrammarChecker,
    ) -> None:
        super().__init__(config)
        self._engine, self._timeout, self._grammars = engine, timeout, grammars
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._signalled = False
        self.exit_code = 0

    async def serve(self, sockets: list | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in uvicorn's captured signals: it would re-raise them on exit.
        if self._loop is None or self._signalled or self.should_exit:
            self.force_exit = self.should_exit
            self.should_exit = True
            return
        self._signalled = True
        logger.info("received %s: draining", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await drain(self._engine, self._timeout, self._grammars)
        finally:
            self.should_exit = True

    def fail(self, exit_code: int) -> None:
        """Stop serving with ``exit_code`` (used when the model fails to load)."""
        self.exit_code = exit_code
        self.should_exit = True
