"""The NetworkPolicy that limits who may reach the server pods: spec.networkPolicy's, or
with spec.router alone one that admits only the endpoint picker to the KV-event ports (the
stream carries every user's prompt and output token ids) and leaves the server port open.
"""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata, selector_labels
from .picker import picker_selector

SAME_NAMESPACE: dict[str, Any] = {"podSelector": {}}
# With spec.adapters the operator calls the pods' adapter routes, and with scale to zero
# its activator forwards requests and reads /metrics: its pods (the chart's labels), in
# whatever namespace it runs.
OPERATOR_PODS: dict[str, Any] = {
    "namespaceSelector": {},
    "podSelector": {
        "matchLabels": {
            "app.kubernetes.io/name": "octavo",
            "app.kubernetes.io/component": "operator",
        }
    },
}


def wants_network_policy(isvc: InferenceService) -> bool:
    """spec.networkPolicy asks for one; spec.router needs one for its KV-event ports."""
    return isvc.network_policy is not None or isvc.router is not None


def network_policy(isvc: InferenceService) -> dict[str, Any]:
    """Ingress only to the server port, from the chosen peers (default: the namespace's own
    pods; with spec.router alone: anyone) and from the scrape peers, and to the KV-event
    ports from the picker; egress stays open (model downloads, DNS)."""
    ingress = [server_ingress(isvc)]
    if isvc.router is not None:
        ingress.append(picker_ingress(isvc))
    if isvc.engine.multi_node:
        ingress.append(group_ingress(isvc))
    if isvc.disaggregated:
        ingress.append(kv_transfer_ingress(isvc))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(isvc, isvc.name),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(isvc)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def server_ingress(isvc: InferenceService) -> dict[str, Any]:
    port = {"port": c.SERVER_PORT, "protocol": "TCP"}
    policy = isvc.network_policy
    if policy is None:  # spec.router alone: the server port stays as open as without it
        return {"ports": [port]}
    peers = [*(policy.allow_from or (SAME_NAMESPACE,)), *policy.allow_scrape_from]
    if isvc.adapters is not None or isvc.scales_to_zero:
        peers.append(OPERATOR_PODS)
    return {"from": [dict(p) for p in peers], "ports": [port]}


def picker_ingress(isvc: InferenceService) -> dict[str, Any]:
    """spec.router: the endpoint picker scrapes /metrics and subscribes to the KV events
    and their replays. (The gateway's own pods are for allowFrom to admit.)"""
    router = isvc.router
    assert router is not None
    ports = [c.SERVER_PORT, router.kv_events_port, router.replay_port]
    return {
        "from": [{"podSelector": {"matchLabels": picker_selector(isvc)}}],
        "ports": [{"port": p, "protocol": "TCP"} for p in ports],
    }


def group_ingress(isvc: InferenceService) -> dict[str, Any]:
    """engine.nodes > 1: every TCP port between the pods of the LeaderWorkerSet, the leader
    and its workers: the node channel (--master-port), torch's rendezvous (the next port)
    and the ports gloo and NCCL pick at random."""
    group = {"podSelector": {"matchLabels": {c.LWS_NAME_LABEL: isvc.group_name}}}
    return {"from": [group], "ports": [{"protocol": "TCP"}]}


def kv_transfer_ingress(isvc: InferenceService) -> dict[str, Any]:
    """spec.prefill: every TCP port between the service's pods: a decode pod's sidecar
    calls prefill pods on the server port, its engine their KV side channel and the
    transfer's ports (which the transport may pick at random, as UCX does)."""
    return {
        "from": [{"podSelector": {"matchLabels": selector_labels(isvc)}}],
        "ports": [{"protocol": "TCP"}],
    }
