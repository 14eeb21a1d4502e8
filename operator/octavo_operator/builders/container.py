"""The server container: `octavo serve` arguments, environment, probes, resources."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .adapters import lora_args, lora_modules_env
from .engine_flags import engine_flags
from .kv_events import kv_events_args, kv_events_env, kv_events_ports
from .kv_transfer import kv_transfer_args, kv_transfer_env, kv_transfer_ports
from .volumes import CACHE_PATH, model_argument, volume_mounts

STARTUP_PERIOD_SECONDS = 10
# Seconds kept between the server's own drain deadline and the kubelet's SIGKILL.
SHUTDOWN_MARGIN_SECONDS = 5


def shutdown_timeout(isvc: InferenceService) -> int:
    d = isvc.drain
    left = d.termination_grace_period_seconds - d.pre_stop_seconds - SHUTDOWN_MARGIN_SECONDS
    return max(1, left)


def server_args(isvc: InferenceService, node_args: Sequence[str] = ()) -> list[str]:
    """`octavo serve` arguments; NODE_ARGS (the multi-node flags of a LeaderWorkerSet
    pod) go before extraArgs."""
    args = ["serve"]
    model = model_argument(isvc)
    if model is not None:
        args.append(model)
    if isvc.model.revision:
        args += ["--revision", isvc.model.revision]
    args += ["--host", "0.0.0.0", "--port", str(isvc.engine_port)]
    args += ["--served-model-name", isvc.served_name]
    args += engine_flags(isvc)
    if isvc.adapters is not None:
        args += lora_args()
    args += ["--shutdown-timeout", str(shutdown_timeout(isvc))]
    args += kv_events_args(isvc)
    args += kv_transfer_args(isvc)
    return args + list(node_args) + list(isvc.engine.extra_args)


def server_env(isvc: InferenceService) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "OCTAVO_CACHE", "value": CACHE_PATH},
        {"name": "HF_HOME", "value": f"{CACHE_PATH}/huggingface"},
        {"name": "HOME", "value": "/tmp"},
    ]
    if isvc.api_key is not None:
        ref = {"name": isvc.api_key.name, "key": isvc.api_key.key}
        env.append({"name": "OCTAVO_API_KEY", "valueFrom": {"secretKeyRef": ref}})
    if isvc.adapters:
        env.append(lora_modules_env(isvc))
    env += kv_events_env(isvc)
    env += kv_transfer_env(isvc)
    return env + [dict(e) for e in isvc.env]


def port_name(isvc: InferenceService) -> str:
    """The engine's port: the pod's `http` port, or behind a decode pod's sidecar `engine`."""
    return c.ENGINE_PORT_NAME if isvc.engine_port != c.SERVER_PORT else c.SERVER_PORT_NAME


def probes(isvc: InferenceService) -> dict[str, Any]:
    """Startup budget from spec.startup; readiness drops fast; liveness is lenient."""
    http = {"path": "/health", "port": port_name(isvc)}
    failures = math.ceil(isvc.startup_timeout_seconds / STARTUP_PERIOD_SECONDS)
    return {
        "startupProbe": {
            "httpGet": http,
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "failureThreshold": failures,
            "timeoutSeconds": 5,
        },
        "readinessProbe": {
            "httpGet": http,
            "periodSeconds": 5,
            "failureThreshold": 2,
            "timeoutSeconds": 3,
        },
        "livenessProbe": {
            "httpGet": http,
            "periodSeconds": 15,
            "failureThreshold": 8,
            "timeoutSeconds": 10,
        },
    }


def resources(isvc: InferenceService) -> dict[str, Any]:
    r = isvc.resources
    amounts: dict[str, str] = {}
    if r.cpu is not None:
        amounts["cpu"] = r.cpu
    if r.memory is not None:
        amounts["memory"] = r.memory
    if r.gpu > 0:
        amounts[r.gpu_resource_name] = str(r.gpu)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def server_container(isvc: InferenceService, image: str) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": c.CONTAINER_NAME,
        "image": image,
        "command": ["octavo"],
        "args": server_args(isvc),
        "env": server_env(isvc),
        "ports": [
            {"name": port_name(isvc), "containerPort": isvc.engine_port, "protocol": "TCP"},
            *kv_events_ports(isvc),
            *kv_transfer_ports(isvc),
        ],
        **probes(isvc),
        "resources": resources(isvc),
        "securityContext": security_context(),
        "volumeMounts": volume_mounts(isvc),
    }
    if isvc.drain.pre_stop_seconds > 0:  # leave the Service's endpoints before draining
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": isvc.drain.pre_stop_seconds}}}
    return container
