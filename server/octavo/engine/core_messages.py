"""What the API side and the engine core say to each other, and how a core admits requests.

Commands go to the core (``AddRequests``, ``AbortRequests``, ``LoadAdapter``,
``UnloadAdapter``, ``STOP``); events come back (``LoadProgress``, ``CoreReady``, ``LoadFailed``,
``Admitted``, ``AdapterChanged``, ``StepDone``, ``WorkerLost``, ``CoreStopped``). All are plain
picklable data, so the core can run on a thread of the server or in its own process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from octavo.engine.output_wire import pack_outputs, unpack_outputs
from octavo.lora_request import LoRARequest
from octavo.progress import PhaseProgress
from octavo.sampling_params import SamplingParams

if TYPE_CHECKING:  # images come with torch; a text prompt's server process does without
    from octavo.multimodal.processor import ProcessedPrompt

logger = logging.getLogger(__name__)


class AdmissionFailed(Exception):
    """The engine raised something unexpected while adding a request (an HTTP 500)."""


@dataclass
class NewRequest:
    request_id: str
    prompt_token_ids: list[int] | ProcessedPrompt  # token ids, or a prompt with images
    params: SamplingParams
    lora_request: LoRARequest | None = None


@dataclass
class AddRequests:
    """All the engine requests of one HTTP request: admitted together or not at all."""

    batch_id: str
    requests: list[NewRequest]
    arrival_time: float


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class LoadAdapter:
    """Check and register a LoRA adapter (answered by ``AdapterChanged``)."""

    command_id: str
    lora_request: LoRARequest


@dataclass
class UnloadAdapter:
    command_id: str
    lora_int_id: int


class Stop:
    """Ask the core to exit its loop."""


STOP = Stop()


@dataclass
class LoadProgress:
    """A start-up phase's progress while the core loads (``octavo.progress``): at most one
    every ``NOTIFY_EVERY_SECONDS`` per phase, plus its start and end."""

    progress: PhaseProgress


@dataclass
class CoreReady:
    info: Any  # the EngineInfo the front end may read


@dataclass
class LoadFailed:
    message: str


@dataclass
class Admitted:
    """The answer to one ``AddRequests``: ``error`` is None when all were added."""

    batch_id: str
    count: int
    error: Exception | None


@dataclass
class AdapterChanged:
    """The answer to ``LoadAdapter``/``UnloadAdapter``: ``error`` None when it was done."""

    command_id: str
    error: Exception | None


@dataclass
class StepDone:
    outputs: list[Any]  # RequestOutput
    stats: Any  # EngineStats after the step

    def __reduce__(self) -> tuple:
        """Pickled with its outputs as plain tuples (``output_wire``: a step of 256
        streaming requests pickles several times faster in the core's loop)."""
        return _step_done, (pack_outputs(self.outputs), self.stats)


def _step_done(packed: list[Any], stats: Any) -> StepDone:
    return StepDone(unpack_outputs(packed), stats)


@dataclass
class WorkerLost:
    """A worker process died: the engine is dead, though its loop has not noticed yet
    (it may be waiting for the other workers). Sent from the core's watch thread."""

    message: str


@dataclass
class CoreStopped:
    """The core's loop ended: asked to (``dead`` False) or it crashed."""

    message: str
    dead: bool


def admit(engine: Any, command: AddRequests) -> Exception | None:
    """Add every request of ``command``; on any refusal, abort those already added.

    Returns ``None`` when all were added, the engine's ``ValueError`` when it refused a
    prompt (an HTTP 400), or ``AdmissionFailed`` for anything else (an HTTP 500); the
    engine thread goes on either way.
    """
    added: list[str] = []
    try:
        for request in command.requests:
            engine.add_request(
                request.request_id,
                request.prompt_token_ids,
                request.params,
                command.arrival_time,
                lora_request=request.lora_request,
            )
            added.append(request.request_id)
    except ValueError as error:
        return _undo(engine, added, error)
    except Exception as error:
        logger.exception("adding request %s failed", command.batch_id)
        return _undo(engine, added, AdmissionFailed(f"could not add the request: {error}"))
    return None


def _undo(engine: Any, added: list[str], error: Exception) -> Exception:
    for request_id in added:
        engine.abort_request(request_id)
    return error


def change_adapter(engine: Any, command: LoadAdapter | UnloadAdapter) -> AdapterChanged:
    """Run one adapter command: a bad adapter or an unknown id is a ``ValueError``."""
    try:
        if isinstance(command, LoadAdapter):
            engine.add_lora(command.lora_request)
        elif not engine.remove_lora(command.lora_int_id):
            raise ValueError(f"no LoRA adapter with id {command.lora_int_id}")
    except ValueError as error:
        return AdapterChanged(command.command_id, error)
    except Exception as error:
        logger.exception("changing LoRA adapters failed")
        failure = AdmissionFailed(f"changing LoRA adapters failed: {error}")
        return AdapterChanged(command.command_id, failure)
    return AdapterChanged(command.command_id, None)
