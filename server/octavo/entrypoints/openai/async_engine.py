"""The engine off the event loop: one thread owns the ``LLMEngine``; requests stream back.

The engine is single-threaded, so a dedicated thread loads it, then loops: take the
add/abort commands waiting in a thread-safe queue, run one ``step()`` while any request
is unfinished (block on the queue when idle), and hand each ``RequestOutput`` to its
request's ``asyncio.Queue`` on the event loop via ``call_soon_threadsafe``.

Each ``add`` is acknowledged by the engine thread, so a prompt the engine rejects is
reported to the caller (HTTP 400) before any response starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from octavo.engine.stats import EngineStats
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams

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


@dataclass
class EngineInfo:
    """Facts about the loaded engine that the event loop may read freely."""

    tokenizer: Any  # a private copy: the engine thread keeps using its own
    max_model_len: int
    tokenizer_size: int
    model_name: str


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float


@dataclass
class _Abort:
    request_id: str


_STOP = object()


class RequestStream:
    """The outputs of one request, in order; ``close()`` aborts it if unfinished."""

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self.request_id = request_id
        self.finished = False
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._closed = False

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Yield each output once, ending after the final one."""
        while not self.finished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            yield item

    async def final(self) -> RequestOutput:
        """Wait for the request to finish and return its last (complete) output."""
        last: RequestOutput | None = None
        async for output in self.outputs():
            last = output
        assert last is not None
        return last

    def close(self) -> None:
        """Stop following the request; abort it in the engine if it is still running."""
        if self._closed:
            return
        self._closed = True
        if not self.finished:
            self._engine.abort(self.request_id)
        self._engine.forget(self.request_id)


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
        self._commands.put(_STOP)
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
    async def add(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> RequestStream:
        """Queue a request and wait until the engine accepted it (``ValueError`` if not)."""
        self.check_available()
        self._reserve_queue_slot()
        stream = RequestStream(self, request_id)
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._streams[request_id], self._acks[request_id] = stream, ack
        self._commands.put(_Add(request_id, prompt_token_ids, params, time.monotonic()))
        try:
            await ack
        except BaseException:
            stream.close()
            raise
        return stream

    def _reserve_queue_slot(self) -> None:
        with self._lock:
            waiting = self._pending_adds + self._engine_waiting
            if self._max_queue_len is not None and waiting >= self._max_queue_len:
                raise QueueFull(
                    f"{waiting} requests are already waiting (--max-queue-len "
                    f"{self._max_queue_len}); retry later"
                )
            self._pending_adds += 1

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def abort_all(self) -> None:
        for request_id in list(self._streams):
            self.abort(request_id)

    def forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._acks.pop(request_id, None)

    # ----- callbacks run on the event loop ------------------------------------------------
    def _resolve_ack(self, request_id: str, error: Exception | None) -> None:
        ack = self._acks.pop(request_id, None)
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
        for request_id in list(self._acks):
            self._resolve_ack(request_id, EngineDead(message))
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
            self.info = EngineInfo(
                tokenizer=copy.deepcopy(engine.tokenizer),
                max_model_len=engine.max_model_len,
                tokenizer_size=len(engine.tokenizer),
                model_name=engine.model_name,
            )
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
            if any(command is _STOP for command in commands):
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

    def _apply(self, engine: Any, command: _Add | _Abort) -> bool:
        """Run one command on the engine; True if it was an abort (outputs are pending)."""
        if isinstance(command, _Abort):
            engine.abort_request(command.request_id)
            return True
        error: Exception | None = None
        try:
            engine.add_request(
                command.request_id, command.prompt_token_ids, command.params, command.arrival_time
            )
        except ValueError as exc:
            error = exc
        with self._lock:
            self._pending_adds -= 1
            self._engine_waiting += error is None
        self._call_soon(self._resolve_ack, command.request_id, error)
        return False

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
