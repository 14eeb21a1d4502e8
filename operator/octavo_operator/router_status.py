"""The RouterReady condition and `status.router` of a service with spec.router: whether
its InferencePool exists and whether its endpoint picker has available replicas."""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService
from octavo_operator.conditions import ROUTER_READY, Condition

POOL_API_MISSING = "InferencePoolAPIMissing"


def picker_counts(picker: dict[str, Any] | None) -> tuple[int, int]:
    """(wanted, available) replicas of the picker's Deployment; (0, 0) without one."""
    if picker is None:
        return 0, 0
    wanted = (picker.get("spec") or {}).get("replicas") or 0
    return wanted, (picker.get("status") or {}).get("availableReplicas", 0)


def router_condition(
    isvc: InferenceService, pools_served: bool | None, picker: dict[str, Any] | None
) -> Condition:
    if pools_served is False:
        message = (
            f"the InferencePool API ({c.INFERENCE_POOL_API}) is not installed: install its "
            "CRD (the chart's crds.inferencePool=true, or the Gateway API "
            "Inference Extension v1.5.0 manifests); the pool and picker follow"
        )
        return Condition(ROUTER_READY, False, POOL_API_MISSING, message)
    wanted, available = picker_counts(picker)
    if picker is None:
        return Condition(ROUTER_READY, False, "Creating", "creating the pool and its picker")
    if available < 1:
        message = f"endpoint picker {isvc.picker_name}: 0/{wanted} replicas available"
        return Condition(ROUTER_READY, False, "PickerNotReady", message)
    message = (
        f"InferencePool {isvc.name} routes through endpoint picker {isvc.picker_name} "
        f"({available}/{wanted} replicas available)"
    )
    return Condition(ROUTER_READY, True, "PickerReady", message)


def router_fields(isvc: InferenceService, picker: dict[str, Any] | None) -> dict[str, Any]:
    wanted, available = picker_counts(picker)
    return {
        "inferencePool": isvc.name,
        "endpointPicker": isvc.picker_name,
        "pickerReplicas": wanted,
        "pickerAvailableReplicas": available,
    }
