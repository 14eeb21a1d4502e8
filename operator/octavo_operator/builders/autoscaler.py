"""The HorizontalPodAutoscaler. It scales the InferenceService through its /scale
subresource, so the operator stays the only writer of the Deployment's replicas."""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata

# Per-pod metrics as prometheus-adapter serves them (':' is not allowed in those names).
METRICS = {
    "requestsWaiting": "vllm_num_requests_waiting",
    "kvCacheUsage": "vllm_kv_cache_usage_perc",
}


def quantity(value: float) -> str:
    """5 -> '5', 0.75 -> '750m' (Kubernetes quantities have no decimal fractions below 1m)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def horizontal_pod_autoscaler(isvc: InferenceService) -> dict[str, Any]:
    scaling = isvc.autoscaling
    assert scaling is not None
    metric = {
        "type": "Pods",
        "pods": {
            "metric": {"name": METRICS[scaling.metric]},
            "target": {"type": "AverageValue", "averageValue": quantity(scaling.target)},
        },
    }
    target = {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": isvc.name}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(isvc, isvc.name),
        "spec": {
            "scaleTargetRef": target,
            # The HPA cannot go below 1 (HPAScaleToZero is alpha); at minReplicas 0 the
            # operator's idle scaler sets replicas to 0, which also pauses the HPA.
            "minReplicas": max(1, scaling.min_replicas),
            "maxReplicas": scaling.max_replicas,
            "metrics": [metric],
        },
    }
