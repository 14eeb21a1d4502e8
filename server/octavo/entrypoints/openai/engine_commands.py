"""What the event loop asks of the engine thread, and how the engine thread does it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class AdmissionFailed(Exception):
    """The engine raised something unexpected while adding a request (an HTTP 500)."""


@dataclass
class NewRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass
class AddRequests:
    """All the engine requests of one HTTP request: admitted together or not at all."""

    batch_id: str
    requests: list[NewRequest]
    arrival_time: float


@dataclass
class AbortRequests:
    request_ids: list[str]


STOP = object()


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
                request.request_id, request.prompt_token_ids, request.params, command.arrival_time
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
