"""The llm-d router's P/D routing sidecar of each decode pod (spec.prefill), and the
ServiceAccount, Role and RoleBinding it reads the InferencePool with.

As KServe's decode template runs it: a native sidecar (an init container that keeps
running) listening on the pool's port, the engine behind it on DECODE_ENGINE_PORT. With
the picker's `x-prefiller-host-port` header it sends the request to that prefill pod with
`max_tokens` 1 and `kv_transfer_params.do_remote_decode`, then to its own engine with the
prefill's answer; without the header, or for any other path (/health, /metrics), it only
proxies. SSRF protection allows as prefill hosts only the pods of the InferencePool, which
it watches through the API: only the sidecar gets a token (the engine never calls the API).
Plain HTTP on both sides (`--secure-proxy=false`), as the servers themselves speak.
"""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .container import security_context
from .metadata import metadata

TOKEN_VOLUME = "routing-sidecar-token"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"  # in-cluster config reads it
POOL_GROUP = c.INFERENCE_POOL_API.split("/")[0]
COMPONENT = "routing-sidecar"  # COMPONENT_LABEL of its RBAC objects
READ = ["get", "list", "watch"]


def sidecar_args(isvc: InferenceService) -> list[str]:
    """v0.10.0's flags (pkg/sidecar/proxy/options.go): --model-server-port replaces the
    deprecated --vllm-port that KServe's template still uses."""
    return [
        f"--port={c.SERVER_PORT}",
        f"--model-server-port={c.DECODE_ENGINE_PORT}",
        "--kv-connector=nixlv2",
        "--secure-proxy=false",
        "--enable-ssrf-protection=true",
        f"--pool-group={POOL_GROUP}",
        f"--inference-pool={isvc.namespace}/{isvc.name}",
    ]


def sidecar_container(isvc: InferenceService, image: str) -> dict[str, Any]:
    prefill = isvc.prefill
    assert prefill is not None
    return {
        "name": c.SIDECAR_CONTAINER_NAME,
        "image": prefill.sidecar.image or image,
        "command": ["/app/pd-sidecar"],
        "args": sidecar_args(isvc),
        "restartPolicy": "Always",  # a native sidecar: up before the engine, down after it
        "ports": [{"name": c.SERVER_PORT_NAME, "containerPort": c.SERVER_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": c.SERVER_PORT_NAME}, "periodSeconds": 5},
        "resources": dict(prefill.sidecar.resources),
        "securityContext": security_context(),
        "volumeMounts": [{"name": TOKEN_VOLUME, "mountPath": TOKEN_PATH, "readOnly": True}],
    }


def token_volume() -> dict[str, Any]:
    """What automountServiceAccountToken would mount, for the sidecar's container only."""
    sources = [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {
            "downwardAPI": {
                "items": [
                    {
                        "path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                    }
                ]
            }
        },
    ]
    return {"name": TOKEN_VOLUME, "projected": {"sources": sources, "defaultMode": 0o444}}


def add_routing_sidecar(spec: dict[str, Any], isvc: InferenceService, image: str) -> None:
    """Put the sidecar, its token and its ServiceAccount into a decode pod's SPEC."""
    spec["initContainers"] = [sidecar_container(isvc, image)]
    spec["volumes"] = [*spec["volumes"], token_volume()]
    spec["serviceAccountName"] = isvc.sidecar_name


def sidecar_service_account(isvc: InferenceService) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(isvc, isvc.sidecar_name, COMPONENT),
    }


def sidecar_role(isvc: InferenceService) -> dict[str, Any]:
    """Read the pool and its pods (the SSRF allow-list); nothing else."""
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": READ},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": READ},
    ]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(isvc, isvc.sidecar_name, COMPONENT),
        "rules": rules,
    }


def sidecar_role_binding(isvc: InferenceService) -> dict[str, Any]:
    subject = {"kind": "ServiceAccount", "name": isvc.sidecar_name, "namespace": isvc.namespace}
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": isvc.sidecar_name}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(isvc, isvc.sidecar_name, COMPONENT),
        "roleRef": role,
        "subjects": [subject],
    }
