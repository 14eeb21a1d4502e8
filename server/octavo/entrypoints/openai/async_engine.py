"""The engine off the event loop: one thread owns the ``LLMEngine``; requests stream back.

The engine is single-threaded, so a dedicated thread loads it, then loops: take the
add/abort commands waiting in a thread-safe queue, run one ``step()`` while any request
is unfinished (block on the queue when idle), and hand each ``RequestOutput`` to its
request's ``asyncio.Queue`` on the event loop via ``call_soon_threadsafe``.

All the engine requests of one HTTP request travel in one command and are acknowledged
once: the engine thread adds them all or none, so a prompt the engine rejects is reported
to the caller (HTTP 400) before any response starts. Letting go of them (a client that
left) is one abort command for all of them, too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from octavo.engine.stats import EngineStats
from octavo.entrypoints.openai.engine_commands import (
    STOP,
    AbortRequests,
    AddRequests,
    NewRequest,
    admit,
)
from octavo.entrypoints.openai.engine_info import EngineInfo, read_engine_info
from octavo.entrypoints.openai.request_stream import RequestStream
from octavo.outputs import RequestOutput

logger = logging.getLogger(__name__)

StepObserver = Callable[[list[RequestOutput], EngineStats], None]


class EngineUnavailable(Exception):
    """The engine cannot take requests now (``reason``: loading, draining or dead)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class QueueFull(Exception):
    """Too many requests are already waiting to be scheduled."""


class EngineDead(Exception):
    """The engine thread stopped while this request was in flight."""


class AsyncEngine:
    """Runs an engine (built by ``factory`` on the engine thread) for asyncio callers."""

    def __init__(
        self,
        factory: Callable[[], Any],
        max_queue_len: int | None = None,
        on_step: StepObserver | None = None,
        on_load_failure: Callable[[], None] | None = None,
    ) -> None:
        self._factory, self._max_queue_len = factory, max_queue_len
        self._on_step, self._on_load_failure = on_step, on_load_failure
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._acks: dict[str, asyncio.Future[None]] = {}
        self._lock = threading.Lock()
        self._pending_adds = 0  # added here, not yet seen by the engine thread
        self._engine_waiting = 0  # requests the engine's scheduler has not started
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.status = "loading"  # loading -> ready -> stopped | dead; or failed
        self.draining = False
        self.info: EngineInfo | None = None

    # ----- lifecycle (event loop) ---------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; it loads the model, then serves."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="octavo-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the engine thread to exit and wait for it (a loading engine is left behind)."""
        self._commands.put(STOP)
        if self._thread is not None and self.status != "loading":
            self._thread.join(timeout)

    @property
    def is_ready(self) -> bool:
        """True while the engine is loaded and its thread is alive."""
        alive = self._thread is not None and self._thread.is_alive()
        return alive and self.status == "ready"

    @property
    def num_open(self) -> int:
        """Requests that callers still follow (the in-flight count used by draining)."""
        return len(self._streams)

    def check_available(self) -> None:
        """Raise ``EngineUnavailable`` unless new requests can be taken now."""
        if self.draining:
            raise EngineUnavailable("draining", "the server is shutting down")
        if self.status == "loading":
            raise EngineUnavailable("loading", "the model is still loading")
        if not self.is_ready:
            raise EngineUnavailable("engine_dead", f"the engine is not running ({self.status})")

    # ----- requests (event loop) ----------------------------------------------------------
    async def add_requests(self, batch_id: str, requests: list[NewRequest]) -> list[RequestStream]:
        """Queue the requests of one HTTP request together and wait until the engine took
        them all (``ValueError`` if it refused one: then none of them stays)."""
        self.check_available()
        self._reserve_queue_slots(len(requests))
        streams = [RequestStream(request.request_id, self.release) for request in requests]
        self._streams.update((stream.request_id, stream) for stream in streams)
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks[batch_id] = ack
        self._commands.put(AddRequests(batch_id, requests, time.monotonic()))
        try:
            await ack
        except BaseException:
            self._acks.pop(batch_id, None)
            # A refusal (or a dead engine) leaves nothing in the engine; else abort them.
            refused = ack.done() and not ack.cancelled() and ack.exception() is not None
            for stream in streams:
                stream.finished |= refused
            self.release(streams)
            raise
        return streams

    def _reserve_queue_slots(self, count: int) -> None:
        """Refuse while the queue is full; a request's prompts are admitted as one."""
        with self._lock:
            waiting = self._pending_adds + self._engine_waiting
            if self._max_queue_len is not None and waiting >= self._max_queue_len:
                raise QueueFull(
                    f"{waiting} requests are already waiting (--max-queue-len "
                    f"{self._max_queue_len}); retry later"
                )
            self._pending_adds += count

    def release(self, streams: list[RequestStream]) -> None:
        """Stop following ``streams``: one abort command for the unfinished ones."""
        unfinished = [s.request_id for s in streams if not (s.closed or s.finished)]
        for stream in streams:
            stream.closed = True
            self._streams.pop(stream.request_id, None)
        if unfinished:
            self._commands.put(AbortRequests(unfinished))

    def abort_all(self) -> None:
        if self._streams:
            self._commands.put(AbortRequests(list(self._streams)))

    # ----- callbacks run on the event loop ------------------------------------------------
    def _resolve_ack(self, batch_id: str, error: Exception | None) -> None:
        ack = self._acks.pop(batch_id, None)
        if ack is None or ack.done():
            return
        if error is None:
            ack.set_result(None)
        else:
            ack.set_exception(error)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put(output)

    def _fail_all(self, message: str) -> None:
        for batch_id in list(self._acks):
            self._resolve_ack(batch_id, EngineDead(message))
        for stream in self._streams.values():
            stream.put(EngineDead(message))

    def _call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        # A closed loop (RuntimeError) means nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, *args)

    # ----- the engine thread --------------------------------------------------------------
    def _run(self) -> None:
        engine = self._load()
        if engine is None:
            return
        message = "the engine stopped"
        try:
            self._serve(engine)
            self.status = "stopped"
        except BaseException:
            logger.exception("the engine loop crashed")
            self.status, message = "dead", "the engine loop crashed"
        finally:
            self._call_soon(self._fail_all, message)

    def _load(self) -> Any | None:
        try:
            engine = self._factory()
            self.info = read_engine_info(engine)
        except BaseException:
            logger.exception("the engine failed to load")
            self.status = "failed"
            if self._on_load_failure is not None:
                self._call_soon(self._on_load_failure)
            return None
        self.status = "ready"
        logger.info("engine ready: %s (max_model_len %d)", engine.model_name, engine.max_model_len)
        return engine

    def _serve(self, engine: Any) -> None:
        while True:
            commands = self._take_commands(block=not engine.has_unfinished_requests())
            if any(command is STOP for command in commands):
                return
            aborted = False
            for command in commands:
                aborted |= self._apply(engine, command)
            if not (engine.has_unfinished_requests() or aborted):
                continue
            outputs = engine.step()
            self._after_step(engine, outputs)

    def _take_commands(self, block: bool) -> list[Any]:
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, engine: Any, command: AddRequests | AbortRequests) -> bool:
        """Run one command on the engine; True if outputs are pending (aborted requests)."""
        if isinstance(command, AbortRequests):
            for request_id in command.request_ids:
                engine.abort_request(request_id)
            return True
        error = admit(engine, command)
        count = len(command.requests)
        with self._lock:
            self._pending_adds -= count
            self._engine_waiting += 0 if error else count
        self._call_soon(self._resolve_ack, command.batch_id, error)
        return error is not None

    def _after_step(self, engine: Any, outputs: list[RequestOutput]) -> None:
        stats = engine.stats()
        with self._lock:
            self._engine_waiting = stats.num_waiting
        if self._on_step is not None:
            try:
                self._on_step(outputs, stats)
            except Exception:  # metrics must never take the engine down
                logger.exception("step observer failed")
        if outputs:
            self._call_soon(self._deliver, outputs)
