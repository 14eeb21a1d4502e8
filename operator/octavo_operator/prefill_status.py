"""The PrefillReady condition and `status.prefill` of a service with spec.prefill: how many
prefill replicas run and pass /health, or why there are none (an invalid spec.prefill is
Degraded too, and so is one whose object names belong to another owner: prefill_names.py;
the decode pool then serves alone, as without spec.prefill)."""

from __future__ import annotations

from typing import Any

from octavo_operator.api.service import InferenceService
from octavo_operator.conditions import DEGRADED, PREFILL_READY, Condition
from octavo_operator.prefill_names import NAME_TAKEN

INVALID = "PrefillInvalid"


def prefill_counts(isvc: InferenceService, prefill: dict[str, Any] | None) -> tuple[int, int]:
    """(wanted, ready) replicas of the prefill Deployment; wanted from the spec without one."""
    wanted = isvc.prefill.replicas if isvc.prefill is not None else 0
    if prefill is None:
        return wanted, 0
    wanted = (prefill.get("spec") or {}).get("replicas", wanted) or 0
    return wanted, (prefill.get("status") or {}).get("readyReplicas", 0)


def prefill_invalid(isvc: InferenceService, conflict: str | None = None) -> Condition | None:
    """Degraded for an invalid spec.prefill, or for one whose names are taken (CONFLICT)."""
    problem, reason = (conflict, NAME_TAKEN) if conflict else (isvc.prefill_problem, INVALID)
    if problem is None:
        return None
    message = f"{problem}; the decode pool serves alone until it is fixed"
    return Condition(DEGRADED, True, reason, message)


def prefill_condition(
    isvc: InferenceService, prefill: dict[str, Any] | None, conflict: str | None = None
) -> Condition:
    if isvc.prefill_problem is not None:
        return Condition(PREFILL_READY, False, INVALID, isvc.prefill_problem)
    if conflict is not None:
        return Condition(PREFILL_READY, False, NAME_TAKEN, conflict)
    wanted, ready = prefill_counts(isvc, prefill)
    if prefill is None:
        message = f"creating the prefill pool {isvc.prefill_name}"
        return Condition(PREFILL_READY, False, "Creating", message)
    if wanted == 0:
        message = "prefill.replicas is 0: the decode pods compute the prompts themselves"
        return Condition(PREFILL_READY, False, "ScaledToZero", message)
    if ready < 1:
        message = (
            f"prefill pool {isvc.prefill_name}: 0/{wanted} replicas ready; until one is, "
            "the decode pods compute the prompts themselves"
        )
        return Condition(PREFILL_READY, False, "ReplicasNotReady", message)
    message = f"prefill pool {isvc.prefill_name}: {ready}/{wanted} replicas ready"
    return Condition(PREFILL_READY, True, "Serving", message)


def prefill_fields(isvc: InferenceService, prefill: dict[str, Any] | None) -> dict[str, Any]:
    wanted, ready = prefill_counts(isvc, prefill)
    return {"deployment": isvc.prefill_name, "replicas": wanted, "readyReplicas": ready}
