"""Finding which requests of a failed batched step caused the failure.

A step runs many requests together, so an exception in it does not say whose fault it
was. After a batched call fails, the engine calls it again once per request, alone:
the requests whose solo call fails are the culprits and are failed; the others keep
their solo results. When every request fails alone, the engine runs a canary (a tiny
step of its own): if that fails too, or the error is one that no single request can
cause (out of memory), the fault lies with the engine and the original error is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from octavo.executor.multiproc_executor import WorkerDied
from octavo.kv_cache.block_pool import NULL_BLOCK_ID
from octavo.sampling_params import SamplingParams
from octavo.scheduler.output import NewSequenceData, ScheduledSequence, SchedulerOutput

logger = logging.getLogger(__name__)

Key = TypeVar("Key", bound=Hashable)
Result = TypeVar("Result")

# Errors that say the engine (memory, device, a lost worker) is broken, never one request.
ENGINE_ERRORS: tuple[type[BaseException], ...] = (
    MemoryError,
    torch.OutOfMemoryError,
    WorkerDied,
)
MAX_ERROR_MESSAGE = 500  # characters of an exception's text passed on to the client
CANARY_SEQ_ID = -1  # never a real sequence's id


@dataclass
class SoloOutcome(Generic[Key, Result]):
    """What the per-request retry found: results of the innocent, errors of the guilty."""

    results: dict[Key, Result] = field(default_factory=dict)
    failures: dict[Key, str] = field(default_factory=dict)


def retry_alone(
    error: Exception,
    keys: Iterable[Key],
    attempt: Callable[[Key], Result],
    engine_works: Callable[[], bool],
) -> SoloOutcome[Key, Result]:
    """Run ``attempt(key)`` for each key alone after the batched call raised ``error``.

    Raises ``error`` again when it is an engine error, or when no key passes alone and
    ``engine_works()`` (the canary) says the engine itself is broken.
    """
    if isinstance(error, ENGINE_ERRORS):
        raise error
    outcome: SoloOutcome[Key, Result] = SoloOutcome()
    for key in dict.fromkeys(keys):
        try:
            outcome.results[key] = attempt(key)
        except ENGINE_ERRORS:
            raise
        except Exception as solo_error:  # any failure of one request
            logger.warning("request %s failed alone: %r", key, solo_error, exc_info=solo_error)
            outcome.failures[key] = describe(solo_error)
    if not outcome.results and not (outcome.failures and engine_works()):
        raise error  # not one request's fault: nobody to blame, or the canary fails too
    if not outcome.failures:
        logger.warning("a batched call failed but every request passed alone: %r", error)
    return outcome


def describe(error: BaseException) -> str:
    """A short text for the client: the exception's type and message."""
    return f"{type(error).__name__}: {error}"[:MAX_ERROR_MESSAGE]


def canary_step() -> SchedulerOutput:
    """A one-token greedy step any working engine can run: token 0, written into the null
    block (it pads block tables, and attention never reads it)."""
    params = SamplingParams(temperature=0.0, max_tokens=1)
    data = NewSequenceData(CANARY_SEQ_ID, [0], [], params, seed=None)
    scheduled = ScheduledSequence(CANARY_SEQ_ID, [0], 0, [NULL_BLOCK_ID], sample=True)
    return SchedulerOutput(decodes=[scheduled], new_sequences=[data])
