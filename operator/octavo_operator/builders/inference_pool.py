"""The InferencePool (inference.networking.k8s.io/v1, GIE v1.5.0 api/v1) of the service's
server pods: a gateway routes to them through the endpoint picker it names."""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata, serving_labels


def inference_pool(isvc: InferenceService) -> dict[str, Any]:
    router = isvc.router
    assert router is not None
    picker = {
        "name": isvc.picker_name,  # a Service (the default group "" and kind)
        "port": {"number": c.PICKER_GRPC_PORT},
        "failureMode": router.picker.failure_mode,
    }
    return {
        "apiVersion": c.INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": metadata(isvc, isvc.name, component=c.PICKER_COMPONENT),
        "spec": {
            "selector": {"matchLabels": serving_labels(isvc)},
            "targetPorts": [{"number": c.SERVER_PORT}],
            "appProtocol": "http",
            "endpointPickerRef": picker,
        },
    }
