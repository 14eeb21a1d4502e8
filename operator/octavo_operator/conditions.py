"""Status conditions: build them, keep lastTransitionTime across unchanged statuses, and
list the transitions that deserve an Event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
ROUTER_READY = "RouterReady"  # with spec.router: the InferencePool and its endpoint picker
PREFILL_READY = "PrefillReady"  # with spec.prefill: the prefill pool
CONDITION_TYPES = (READY, PROGRESSING, DEGRADED)
# Reasons that are bad news on a first observation too (an Event the moment they are seen).
# Bad news even when it is the first thing seen of a service: a service whose pods the
# scheduler can never place may show it in its very first status (no transition follows).
ALARMING_REASONS = frozenset(
    {"InferencePoolAPIMissing", "InsufficientGPU", "Unschedulable", "PrefillInvalid"}
)


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str

    @property
    def status_text(self) -> str:
        return "True" if self.status else "False"

    @property
    def healthy(self) -> bool:
        """Whether this condition is good news (Degraded=True is not; Ready=True is)."""
        return not self.status if self.type == DEGRADED else self.status

    def as_dict(self, generation: int, since: str) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status_text,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": since,
            "observedGeneration": generation,
        }


def merge(
    old: list[dict[str, Any]], new: list[Condition], generation: int, now: str
) -> list[dict[str, Any]]:
    """New condition dicts; lastTransitionTime moves only when the status changes."""
    previous = {c.get("type"): c for c in old or []}
    out = []
    for cond in new:
        before = previous.get(cond.type)
        unchanged = before is not None and before.get("status") == cond.status_text
        since = before.get("lastTransitionTime", now) if unchanged else now
        out.append(cond.as_dict(generation, since))
    return out


def transitions(old: list[dict[str, Any]], new: list[Condition]) -> list[Condition]:
    """Conditions whose status or reason changed. A first observation counts only when it
    is news on its own: bad news (Degraded=True, an alarming reason), or Ready=True. A new
    service starting up is not an event; one already serving in its first status (its pods
    were ready before a busy operator first wrote it) still says so once."""
    previous = {c.get("type"): (c.get("status"), c.get("reason")) for c in old or []}

    def changed(cond: Condition) -> bool:
        before = previous.get(cond.type)
        if before is None:
            return first_seen_is_news(cond)
        return before != (cond.status_text, cond.reason)

    return [c for c in new if changed(c)]


def first_seen_is_news(cond: Condition) -> bool:
    if cond.type in (READY, DEGRADED) and cond.status:
        return True  # serving already, or degraded already
    return not cond.healthy and cond.reason in ALARMING_REASONS
