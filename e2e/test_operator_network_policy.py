"""spec.networkPolicy: the operator owns a NetworkPolicy for the server pods while it is on,
and deletes it when it is turned off."""

from __future__ import annotations

from kubernetes import client

from e2e import isvc
from e2e.helpers import wait_for

PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def policies(networking: client.NetworkingV1Api, namespace: str) -> list:
    return networking.list_namespaced_network_policy(namespace).items


def test_network_policy_follows_the_spec(operator, namespace, custom, api_client):
    networking = client.NetworkingV1Api(api_client)
    spec = {"replicas": 1, "networkPolicy": {"enabled": True, "allowScrapeFrom": [PROMETHEUS]}}
    isvc.create(custom, namespace, isvc.manifest("fenced", spec))
    (policy,) = wait_for(lambda: policies(networking, namespace), timeout=20, what="a policy")
    assert policy.metadata.name == "fenced"
    assert policy.metadata.owner_references[0].name == "fenced"
    assert policy.spec.policy_types == ["Ingress"]
    assert policy.spec.pod_selector.match_labels["app.kubernetes.io/instance"] == "fenced"
    (rule,) = policy.spec.ingress
    assert [(p.port, p.protocol) for p in rule.ports] == [(8000, "TCP")]
    assert rule._from[0].pod_selector is not None  # the namespace's own pods
    assert (
        rule._from[1].namespace_selector.match_labels
        == PROMETHEUS["namespaceSelector"]["matchLabels"]
    )
    isvc.wait_condition(custom, namespace, "fenced", "Ready", "True")
    isvc.patch(custom, namespace, "fenced", {"spec": {"networkPolicy": {"enabled": False}}})
    wait_for(lambda: not policies(networking, namespace), timeout=20, what="the policy's deletion")
    isvc.wait_condition(custom, namespace, "fenced", "Ready", "True")
