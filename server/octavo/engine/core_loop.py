"""The engine core's loop: take commands, run steps, report events — over any transport.

The same loop runs on a thread of the server (``core_thread``) or in a process of its
own (``core_process``); only how commands arrive (an ``inbox``) and how events leave
(``emit``) differ. While requests are unfinished the loop steps without waiting; when
idle it waits for the next command, checking every ``HEALTH_CHECK_SECONDS`` that the
engine's workers are still alive (a dead one crashes the loop, so the server exits); a
worker's death is also reported at once (``WorkerLost``, from the executor's watch
thread), so the server turns unhealthy while the loop is still stopping the others.
Whichever way the loop ends, the engine is shut down (its worker processes stopped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from octavo.engine.core_messages import (
    AbortRequests,
    Admitted,
    CoreReady,
    CoreStopped,
    LoadAdapter,
    LoadFailed,
    StepDone,
    Stop,
    UnloadAdapter,
    WorkerLost,
    admit,
    change_adapter,
)
from octavo.engine.engine_info import read_engine_info

logger = logging.getLogger(__name__)

HEALTH_CHECK_SECONDS = 1.0
# An idle engine that holds KV blocks for a remote decode (P/D disaggregation) looks this
# often for the side channel's reads and frees, which must run on this thread.
TRANSFER_POLL_SECONDS = 0.002

Emit = Callable[[Any], None]


class Inbox(Protocol):
    def get(self, block: bool, timeout: float | None = None) -> list[Any]:
        """Every waiting command; with ``block``, wait for at least one (at most ``timeout``
        seconds, then return none)."""
        ...


def run_engine_core(factory: Callable[[], Any], inbox: Inbox, emit: Emit) -> None:
    """Load the engine with ``factory``, then serve commands until ``STOP`` or a crash."""
    engine = _load(factory, emit)
    if engine is None:
        return
    engine.on_worker_death(lambda reason: emit(WorkerLost(reason)))
    try:
        _serve(engine, inbox, emit)
    except Exception:
        logger.exception("the engine loop crashed")
        _shutdown(engine)
        emit(CoreStopped("the engine loop crashed", dead=True))
        return
    _shutdown(engine)
    emit(CoreStopped("the engine stopped", dead=False))


def _shutdown(engine: Any) -> None:
    try:
        engine.shutdown()
    except Exception:
        logger.exception("the engine did not shut down cleanly")


def _load(factory: Callable[[], Any], emit: Emit) -> Any | None:
    try:
        engine = factory()
        info = read_engine_info(engine)
    except Exception:
        logger.exception("the engine failed to load")
        emit(LoadFailed("the engine failed to load"))
        return None
    import torch  # loaded with the engine; not at the top, which the API process imports

    logger.info(
        "engine ready: %s (max_model_len %d, %d tokens per step, %d threads)",
        engine.model_name,
        engine.max_model_len,
        engine.scheduler.max_num_batched_tokens,
        torch.get_num_threads(),
    )
    if hasattr(engine, "token_deltas"):  # (test doubles of the engine lack it)
        engine.token_deltas = True  # the AsyncEngine behind ``emit`` expands them
    emit(CoreReady(info))
    return engine


def _serve(engine: Any, inbox: Inbox, emit: Emit) -> None:
    while True:
        idle = not engine.has_unfinished_requests()
        transfers = idle and _transfers_busy(engine)
        wait = TRANSFER_POLL_SECONDS if transfers else HEALTH_CHECK_SECONDS
        commands = inbox.get(block=idle, timeout=wait if idle else None)
        if transfers and not commands:
            outputs, changed = engine.serve_transfers()
            if outputs or changed:
                emit(StepDone(outputs, engine.stats()))
            continue
        if idle and not commands:
            engine.check_health()
            continue
        if any(isinstance(command, Stop) for command in commands):
            return
        outputs_pending = False
        for command in commands:
            outputs_pending |= _apply(engine, command, emit)
        if engine.has_unfinished_requests() or outputs_pending:
            outputs = engine.step()
            emit(StepDone(outputs, engine.stats()))


def _transfers_busy(engine: Any) -> bool:
    busy = getattr(engine, "transfers_busy", None)  # (test doubles of the engine lack it)
    return busy is not None and busy()


def _apply(engine: Any, command: Any, emit: Emit) -> bool:
    """Run one command; True when it left outputs to report (aborted or undone requests)."""
    if isinstance(command, AbortRequests):
        for request_id in command.request_ids:
            engine.abort_request(request_id)
        return True
    if isinstance(command, LoadAdapter | UnloadAdapter):
        emit(change_adapter(engine, command))
        return False
    error = admit(engine, command)
    emit(Admitted(command.batch_id, len(command.requests), error))
    return error is not None
