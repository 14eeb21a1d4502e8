"""The asyncio face of the engine core: requests go in as commands, outputs stream back.

The engine core (``core_loop``) runs in a process of its own (``ProcessCore``, what
``octavo serve`` uses) or on a thread (``ThreadCore``, for tests that reach into the
engine). It reports events on a thread of its own; this class turns them into state
(ready, dead) and acknowledgements, and hands each step's outputs and statistics to the
event loop (``call_soon_threadsafe``): there the streams that decode their own text get
it (``stream_text``, which may end a request at a stop string), the metrics see them, and
each output goes to its request's ``asyncio.Queue``.

All the engine requests of one HTTP request travel in one command and are acknowledged
once: the core adds them all or none, so a prompt the engine rejects is reported to the
caller (HTTP 400) before any response starts. Letting go of them (a client that left) is
one abort command for all of them, too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from octavo.engine.core_loop import Emit
from octavo.engine.core_messages import (
    STOP,
    AbortRequests,
    AdapterChanged,
    AddRequests,
    Admitted,
    CoreReady,
    CoreStopped,
    LoadAdapter,
    LoadFailed,
    LoadProgress,
    NewRequest,
    StepDone,
    UnloadAdapter,
    WorkerLost,
)
from octavo.engine.engine_info import EngineInfo
from octavo.engine.request_stream import RequestStream
from octavo.engine.stats import EngineStats
from octavo.engine.stream_text import StreamText, decodes_in_server
from octavo.outputs import RequestOutput
from octavo.progress import PhaseProgress, add_listener, remove_listener

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
    """The engine core stopped while this request was in flight."""


class EngineCore(Protocol):
    """Where the engine core runs: ``ThreadCore`` or ``ProcessCore``."""

    def start(self, emit: Emit) -> None: ...
    def send(self, command: Any) -> None: ...
    def is_alive(self) -> bool: ...
    def join(self, timeout: float) -> None: ...


class AsyncEngine:
    """Runs an engine core for asyncio callers."""

    def __init__(
        self,
        core: EngineCore,
        max_queue_len: int | None = None,
        on_step: StepObserver | None = None,
        on_load_failure: Callable[[], None] | None = None,
        on_death: Callable[[], None] | None = None,
    ) -> None:
        self._core, self._max_queue_len = core, max_queue_len
        self._on_step, self._on_load_failure = on_step, on_load_failure
        self._on_death = on_death
        self._streams: dict[str, RequestStream] = {}
        self._stopped_here: set[str] = set()  # ended here at a stop string; the core not yet
        self._acks: dict[str, asyncio.Future[None]] = {}
        self._lock = threading.Lock()
        self._pending_adds = 0  # added here, not yet acknowledged by the core
        self._engine_waiting = 0  # requests the engine's scheduler has not started
        self._loop: asyncio.AbstractEventLoop | None = None
        self.status = "loading"  # loading -> ready -> stopped | dead; or failed
        self.draining = False
        self._drain_started: float | None = None  # time.monotonic() when draining began
        self.info: EngineInfo | None = None
        self.load_progress: PhaseProgress | None = None  # the latest phase while loading

    # ----- lifecycle (event loop) ---------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine core; it loads the model, then serves."""
        self._loop = loop
        add_listener(self._on_local_progress)  # a core on a thread reports in this process
        self._core.start(self._on_event)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the engine core to exit and wait for it (a loading engine is left behind)."""
        self._core.send(STOP)
        if self.status != "loading":
            self._core.join(timeout)

    @property
    def is_ready(self) -> bool:
        """True while the engine is loaded and its core is alive."""
        return self.status == "ready" and self._core.is_alive()

    @property
    def num_open(self) -> int:
        """Requests that callers still follow (the in-flight count used by draining)."""
        return len(self._streams)

    def start_draining(self) -> None:
        """Refuse requests that arrive from now on (those already in the server still run)."""
        self.draining, self._drain_started = True, time.monotonic()

    def check_available(self, arrived_at: float | None = None) -> None:
        """Raise ``EngineUnavailable`` unless new requests can be taken now; while draining,
        only a request that ``arrived_at`` before the drain began is taken."""
        if self.draining and not self._arrived_before_drain(arrived_at):
            raise EngineUnavailable("draining", "the server is shutting down")
        if self.status == "loading":
            raise EngineUnavailable("loading", "the model is still loading")
        if not self.is_ready:
            raise EngineUnavailable("engine_dead", f"the engine is not running ({self.status})")

    def _arrived_before_drain(self, arrived_at: float | None) -> bool:
        started = self._drain_started
        return arrived_at is not None and started is not None and arrived_at < started

    # ----- requests (event loop) ----------------------------------------------------------
    async def add_requests(
        self, batch_id: str, requests: list[NewRequest], arrived_at: float | None = None
    ) -> list[RequestStream]:
        """Queue the requests of one HTTP request together and wait until the engine took
        them all (``ValueError`` if it refused one: then none of them stays). ``arrived_at``:
        when the HTTP request arrived (one that came before a drain began is still taken)."""
        self.check_available(arrived_at)
        self._reserve_queue_slots(len(requests))
        opened = [self._open(request) for request in requests]
        streams = [stream for stream, _ in opened]
        requests = [core_request for _, core_request in opened]
        self._streams.update((stream.request_id, stream) for stream in streams)
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks[batch_id] = ack
        self._core.send(AddRequests(batch_id, requests, time.monotonic()))
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

    def _open(self, request: NewRequest) -> tuple[RequestStream, NewRequest]:
        """The request's stream, and what the core is sent: without text where the stream
        decodes it itself (``stream_text``)."""
        tokenizer = None if self.info is None else self.info.tokenizer
        if not decodes_in_server(request.params, tokenizer):
            return RequestStream(request.request_id, self.release), request
        prompt = request.prompt_token_ids
        token_ids = prompt if isinstance(prompt, list) else prompt.token_ids
        text = StreamText(tokenizer, token_ids, request.params)
        core_request = replace(request, params=StreamText.core_params(request.params))
        return RequestStream(request.request_id, self.release, text), core_request

    async def change_adapter(self, command: LoadAdapter | UnloadAdapter) -> None:
        """Load or unload a LoRA adapter in the engine; ``ValueError`` when it refused."""
        self.check_available()
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks[command.command_id] = ack
        self._core.send(command)
        try:
            await ack
        finally:
            self._acks.pop(command.command_id, None)

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
            self._core.send(AbortRequests(unfinished))

    def abort_all(self) -> None:
        if self._streams:
            self._core.send(AbortRequests(list(self._streams)))

    # ----- callbacks run on the event loop ------------------------------------------------
    def _resolve_ack(self, batch_id: str, error: Exception | None) -> None:
        ack = self._acks.pop(batch_id, None)
        if ack is None or ack.done():
            return
        if error is None:
            ack.set_result(None)
        else:
            ack.set_exception(error)

    def _deliver(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        """A step's outputs, their text decoded where the stream decodes it, to the
        metrics and then to their streams."""
        outputs = self._decode_texts(outputs)
        if self._on_step is not None:
            try:
                self._on_step(outputs, stats)
            except Exception:  # metrics must never take the engine down
                logger.exception("step observer failed")
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put(output)

    def _decode_texts(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Fill the text of the streams that decode it here (``stream_text``). A stop
        string found ends its request here: the core is told to abort it, and what the
        core sends for it after that is dropped (the metrics counted the stop already)."""
        kept, ended_here = [], []
        for output in outputs:
            request_id = output.request_id
            if request_id in self._stopped_here:
                if output.finished:  # the core's last word on it
                    self._stopped_here.discard(request_id)
                continue
            stream = self._streams.get(request_id)
            text = None if stream is None else stream.text
            core_finished = output.finished
            if text is not None and text.fill_output(output) and not core_finished:
                ended_here.append(request_id)
            kept.append(output)
        if ended_here:
            self._stopped_here.update(ended_here)
            self._core.send(AbortRequests(ended_here))
        return kept

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

    # ----- events, on the core's reporting thread -----------------------------------------
    def _on_event(self, event: Any) -> None:
        if isinstance(event, StepDone):
            self._after_step(event.outputs, event.stats)
        elif isinstance(event, Admitted):
            self._admitted(event)
        elif isinstance(event, AdapterChanged):
            self._call_soon(self._resolve_ack, event.command_id, event.error)
        elif isinstance(event, LoadProgress):
            if self.status == "loading":
                self.load_progress = event.progress
        elif isinstance(event, CoreReady):
            self.info, self.status = event.info, "ready"
            remove_listener(self._on_local_progress)
        elif isinstance(event, LoadFailed):
            self.status = "failed"
            remove_listener(self._on_local_progress)
            if self._on_load_failure is not None:
                self._call_soon(self._on_load_failure)
        elif isinstance(event, WorkerLost):
            logger.error("%s: the engine is dead", event.message)
            self.status = "dead"  # unhealthy now; CoreStopped follows once the loop ends
        elif isinstance(event, CoreStopped):
            self._stopped(event)

    def _on_local_progress(self, progress: PhaseProgress) -> None:
        self._on_event(LoadProgress(progress))

    def _admitted(self, event: Admitted) -> None:
        with self._lock:
            self._pending_adds -= event.count
            self._engine_waiting += 0 if event.error else event.count
        self._call_soon(self._resolve_ack, event.batch_id, event.error)

    def _stopped(self, event: CoreStopped) -> None:
        remove_listener(self._on_local_progress)
        self.status = "dead" if event.dead else "stopped"
        self._call_soon(self._fail_all, event.message)
        if event.dead and self._on_death is not None:
            self._call_soon(self._on_death)

    def _after_step(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        with self._lock:
            self._engine_waiting = stats.num_waiting
        self._call_soon(self._deliver, outputs, stats)
