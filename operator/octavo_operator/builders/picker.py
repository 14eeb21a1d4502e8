"""The endpoint picker (spec.router): the llm-d router's EPP Deployment and its Service.

The EPP container runs as the router's deploy manifests run it for v0.10.0 (flags checked
against its pkg/epp/server/options.go): `--pool-name/--pool-namespace/--pool-group` name the
InferencePool, `--config-file` its EndpointPickerConfig (picker_config.py), ext_proc on 9002,
gRPC health on 9003 (services `liveness` and `readiness`), metrics on 9090. Its pods carry
their own name label, so no selector of the server pods (Service, pool, PDB) picks them up.
A `vllm-render`-style sidecar, `octavo launch render`, gives the picker's token producer the
model's token ids (same image and model as the servers).
"""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .container import security_context
from .deployment import pod_security_context
from .metadata import owner_reference
from .volumes import CACHE_PATH, MODELS_PATH, model_argument

PICKER_APP = "octavo-router"
CONFIG_DIR = "/config"
CONFIG_FILE = "epp-config.yaml"


def picker_selector(isvc: InferenceService) -> dict[str, str]:
    return {c.NAME_LABEL: PICKER_APP, c.INSTANCE_LABEL: isvc.name}


def picker_metadata(isvc: InferenceService, name: str | None = None) -> dict[str, Any]:
    """Every picker object: the owner's instance label (drift and status find the owner by
    it), the picker's own name label, and the managed-by label the operator watches."""
    labels = {
        **picker_selector(isvc),
        c.COMPONENT_LABEL: c.PICKER_COMPONENT,
        c.MANAGED_BY_LABEL: c.MANAGED_BY,
    }
    return {
        "name": name or isvc.picker_name,
        "namespace": isvc.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(isvc)],
    }


def picker_args(isvc: InferenceService) -> list[str]:
    router = isvc.router
    assert router is not None
    args = [
        "--pool-name",
        isvc.name,
        "--pool-namespace",
        isvc.namespace,
        "--pool-group",
        c.INFERENCE_POOL_API.split("/")[0],
        "--config-file",
        f"{CONFIG_DIR}/{CONFIG_FILE}",
        "--grpc-port",
        str(c.PICKER_GRPC_PORT),
        "--grpc-health-port",
        str(c.PICKER_HEALTH_PORT),
        "--metrics-port",
        str(c.PICKER_METRICS_PORT),
        "--zap-encoder",
        "json",
        "--tracing=false",
        # Authenticated /metrics needs TokenReviews, which no namespaced Role can grant.
        "--metrics-endpoint-auth=false",
        f"--secure-serving={str(router.picker.secure_serving).lower()}",
    ]
    if router.picker.replicas > 1:
        args.append("--ha-enable-leader-election")
    return args


def grpc_probe(service: str, period: int) -> dict[str, Any]:
    return {
        "grpc": {"port": c.PICKER_HEALTH_PORT, "service": service},
        "initialDelaySeconds": 5,
        "periodSeconds": period,
    }


def picker_container(isvc: InferenceService, image: str) -> dict[str, Any]:
    router = isvc.router
    assert router is not None
    field = {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
    pod_name = {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
    return {
        "name": "epp",
        "image": router.picker.image or image,
        "args": picker_args(isvc),
        "env": [
            {"name": "NAMESPACE", "valueFrom": field},
            {"name": "POD_NAME", "valueFrom": pod_name},
        ],
        "ports": [
            {"name": "grpc", "containerPort": c.PICKER_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": c.PICKER_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": c.PICKER_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": grpc_probe("liveness", 10),
        "readinessProbe": grpc_probe("readiness", 2),
        "resources": dict(router.picker.resources),
        "securityContext": security_context(),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def render_args(isvc: InferenceService) -> list[str]:
    """`octavo launch render`: the servers' model and served name, on RENDER_PORT."""
    args = ["launch", "render"]
    model = model_argument(isvc)
    if model is not None:
        args.append(model)
    if isvc.model.revision:
        args += ["--revision", isvc.model.revision]
    return [*args, "--served-model-name", isvc.served_name, "--port", str(c.RENDER_PORT)]


def render_container(isvc: InferenceService, server_image: str) -> dict[str, Any]:
    router = isvc.router
    assert router is not None
    mounts = [
        {"name": "render-cache", "mountPath": CACHE_PATH},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if isvc.model.scheme == "pvc":
        claim, _ = isvc.model.claim_and_path
        mounts.append({"name": "model", "mountPath": f"{MODELS_PATH}/{claim}", "readOnly": True})
    http = {"path": "/health", "port": "render-http"}
    return {
        "name": "tokenizer",
        "image": server_image,
        "command": ["octavo"],
        "args": render_args(isvc),
        "env": [
            {"name": "OCTAVO_CACHE", "value": CACHE_PATH},
            {"name": "HF_HOME", "value": f"{CACHE_PATH}/huggingface"},
            {"name": "HOME", "value": "/tmp"},
            *(dict(e) for e in isvc.env),  # the servers' (e.g. HF_TOKEN for a gated model)
        ],
        "ports": [{"name": "render-http", "containerPort": c.RENDER_PORT, "protocol": "TCP"}],
        "startupProbe": {"httpGet": http, "periodSeconds": 5, "failureThreshold": 360},
        "readinessProbe": {"httpGet": http, "periodSeconds": 10, "timeoutSeconds": 5},
        "resources": tokenizer_resources(isvc),
        "securityContext": security_context(),
        "volumeMounts": mounts,
    }


def tokenizer_resources(isvc: InferenceService) -> dict[str, Any]:
    """spec.router.picker.tokenizerResources as given, else the operator's defaults."""
    router = isvc.router
    assert router is not None
    given = router.picker.tokenizer_resources
    chosen = given if given else c.TOKENIZER_RESOURCES
    return {kind: dict(amounts) for kind, amounts in chosen.items()}


def picker_volumes(isvc: InferenceService) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": isvc.picker_name}},
        {"name": "render-cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if isvc.model.scheme == "pvc":
        claim, _ = isvc.model.claim_and_path
        out.append(
            {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    return out


def picker_pod_spec(isvc: InferenceService, picker_image: str, server_image: str) -> dict[str, Any]:
    return {
        "serviceAccountName": isvc.picker_name,
        "containers": [
            picker_container(isvc, picker_image),
            render_container(isvc, server_image),
        ],
        "volumes": picker_volumes(isvc),
        # Upstream's: at least the longest grace period of the pool's pods.
        "terminationGracePeriodSeconds": 130,
        "securityContext": pod_security_context(),
        "enableServiceLinks": False,
    }


def picker_deployment(
    isvc: InferenceService, picker_image: str, server_image: str
) -> dict[str, Any]:
    """Recreate, as upstream: one active picker (its prefix index is in memory); with more
    replicas a leader serves and the others wait."""
    router = isvc.router
    assert router is not None
    pod_labels = {**picker_selector(isvc), c.COMPONENT_LABEL: c.PICKER_COMPONENT}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": picker_metadata(isvc),
        "spec": {
            "replicas": router.picker.replicas,
            "selector": {"matchLabels": picker_selector(isvc)},
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 5,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": picker_pod_spec(isvc, picker_image, server_image),
            },
        },
    }


def picker_service(isvc: InferenceService) -> dict[str, Any]:
    ports = [
        {
            "name": "grpc-ext-proc",
            "port": c.PICKER_GRPC_PORT,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "kubernetes.io/h2c",
        },
        {
            "name": "http-metrics",
            "port": c.PICKER_METRICS_PORT,
            "targetPort": "metrics",
            "protocol": "TCP",
        },
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": picker_metadata(isvc),
        "spec": {"type": "ClusterIP", "selector": picker_selector(isvc), "ports": ports},
    }
