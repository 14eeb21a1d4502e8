"""With spec.prefill, both pools' engines speak vLLM's NixlConnector contract: the flag,
the side channel's address (the pod IP through the Downward API) and its port.

A prefill engine keeps a request's KV blocks under a lease and answers with where to fetch
them (`remote_host`/`remote_port`: this side channel); a decode engine fetches them from
there. `kv_both` lets any engine play either part, as KServe's default configuration does.
spec.prefill.kvTransfer sets what a decode engine does when a fetch fails and how long a
prefill engine holds unread blocks; both pools get the same values (a lease is the prefill
engine's, a failure policy the decode engine's, and `kv_both` engines read both).
"""

from __future__ import annotations

import json
from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def kv_transfer_config(isvc: InferenceService) -> dict[str, Any]:
    assert isvc.prefill is not None
    kv = isvc.prefill.kv_transfer
    return {
        **KV_TRANSFER_CONFIG,
        "kv_load_failure_policy": kv.failure_policy,
        "kv_connector_extra_config": {"kv_lease_duration": kv.lease_seconds},
    }


def kv_transfer_args(isvc: InferenceService) -> list[str]:
    if isvc.role is None:
        return []
    return ["--kv-transfer-config", json.dumps(kv_transfer_config(isvc), separators=(",", ":"))]


def kv_transfer_env(isvc: InferenceService) -> list[dict[str, Any]]:
    if isvc.role is None:
        return []
    pod_ip = {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
    return [
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": pod_ip},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(c.NIXL_SIDE_CHANNEL_PORT)},
    ]


def kv_transfer_ports(isvc: InferenceService) -> list[dict[str, Any]]:
    if isvc.role is None:
        return []
    port = {"name": c.NIXL_PORT_NAME, "containerPort": c.NIXL_SIDE_CHANNEL_PORT}
    return [{**port, "protocol": "TCP"}]
