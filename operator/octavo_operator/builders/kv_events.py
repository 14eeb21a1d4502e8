"""With spec.router, the server publishes KV events (vLLM's `--kv-events-config`) for the
endpoint picker's precise prefix-cache producer.

The picker dials each pool pod at tcp://<pod IP>:<kvEventsPort> (its pod discovery:
`kvEventsConfig.discoverPods`, `podDiscoveryConfig.socketPort`) and its replay socket at the
next port, subscribes to topics starting with `kv@`, and reads the model from the topic
`kv@<pod>@<model>`: the served name, which is what requests name.
"""

from __future__ import annotations

import json
from typing import Any

from octavo_operator.api.service import InferenceService

KV_EVENTS_PORT_NAME = "kv-events"
KV_REPLAY_PORT_NAME = "kv-replay"
TOPIC_PREFIX = "kv@"


def kv_events_config(isvc: InferenceService) -> dict[str, Any]:
    router = isvc.router
    assert router is not None
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{router.kv_events_port}",
        "replay_endpoint": f"tcp://*:{router.replay_port}",
        # $(POD_IP) is expanded by the kubelet from the container's env (kv_events_env).
        "topic": f"{TOPIC_PREFIX}$(POD_IP)@{isvc.served_name}",
    }


def kv_events_args(isvc: InferenceService) -> list[str]:
    if isvc.router is None:
        return []
    config = json.dumps(kv_events_config(isvc), separators=(",", ":"))
    return ["--kv-events-config", config]


def kv_events_env(isvc: InferenceService) -> list[dict[str, Any]]:
    if isvc.router is None:
        return []
    pod_ip = {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
    return [{"name": "POD_IP", "valueFrom": pod_ip}]


def kv_events_ports(isvc: InferenceService) -> list[dict[str, Any]]:
    router = isvc.router
    if router is None:
        return []
    return [
        {"name": KV_EVENTS_PORT_NAME, "containerPort": router.kv_events_port, "protocol": "TCP"},
        {"name": KV_REPLAY_PORT_NAME, "containerPort": router.replay_port, "protocol": "TCP"},
    ]
