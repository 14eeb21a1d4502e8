"""Kubernetes Events on an InferenceService, one per condition transition.

Posted with kopf's own facility (``kopf.event``): queued, and posted in the background by
kopf's event loop. It needs kopf's context (its settings and event queue); a status is
written on a writer thread, in the context of the handler that asked for it
(status_queue.py). Outside kopf (a unit test, a tool) there is nothing to post to.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import kopf

from octavo_operator.conditions import Condition

logger = logging.getLogger(__name__)
MESSAGE_LIMIT = 1024  # what the Events API accepts


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def post_transitions(owner: dict[str, Any], changed: list[Condition]) -> None:
    for cond in changed:
        message = f"{cond.type}={cond.status_text}: {cond.message}"[:MESSAGE_LIMIT]
        kind = "Normal" if cond.healthy else "Warning"
        try:
            kopf.event(owner, type=kind, reason=cond.reason, message=message)
        except LookupError:  # no kopf context: not running under the operator
            logger.debug("no event posted for %s (outside kopf)", cond.reason)
