"""spec.networkPolicy: the NetworkPolicy child that limits who reaches the server pods."""

from __future__ import annotations

from octavo_operator import constants as c
from octavo_operator.builders.children import ChildRef, desired_children
from octavo_operator.builders.network_policy import network_policy

from isvc_factories import isvc

SELECTOR = {"app.kubernetes.io/name": "octavo-server", "app.kubernetes.io/instance": "chat"}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
GATEWAY = {"podSelector": {"matchLabels": {"app": "gateway"}}}


def test_default_peers_are_the_pods_of_the_namespace_on_the_server_port_only():
    policy = network_policy(isvc({"networkPolicy": {"enabled": True}}))
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "chat"
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": SELECTOR}
    assert spec["policyTypes"] == ["Ingress"], "egress stays open: model downloads, DNS"
    assert spec["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": [{"port": 8000, "protocol": "TCP"}]}
    ]


def test_chosen_peers_and_prometheus():
    spec = {
        "networkPolicy": {"enabled": True, "allowFrom": [GATEWAY], "allowScrapeFrom": [PROMETHEUS]}
    }
    (rule,) = network_policy(isvc(spec))["spec"]["ingress"]
    assert rule["from"] == [GATEWAY, PROMETHEUS]


def test_scrape_peers_alone_keep_the_namespace_default():
    spec = {"networkPolicy": {"enabled": True, "allowScrapeFrom": [PROMETHEUS]}}
    (rule,) = network_policy(isvc(spec))["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {}}, PROMETHEUS]


def test_turned_off_it_is_removed():
    for spec in ({}, {"networkPolicy": {"enabled": False, "allowFrom": [GATEWAY]}}):
        out = desired_children(isvc(spec), "img:1", service_monitors_served=False)
        assert "NetworkPolicy" not in [o["kind"] for o in out.apply]
        assert ChildRef("networking.k8s.io/v1", "NetworkPolicy", "chat") in out.remove


def test_with_adapters_the_operator_may_reach_the_adapter_routes():
    spec = {"networkPolicy": {"enabled": True}, "adapters": [{"name": "a", "uri": "hf://o/a"}]}
    (rule,) = network_policy(isvc(spec))["spec"]["ingress"]
    assert rule["from"][-1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "operator"
    )
    (plain,) = network_policy(isvc({"networkPolicy": {"enabled": True}}))["spec"]["ingress"]
    assert len(plain["from"]) == 1, "without adapters the operator needs no way in"


def test_router_mode_admits_only_the_picker_to_the_kv_events_by_default():
    """The KV-event stream carries every user's prompt and output token ids: with
    spec.router a NetworkPolicy exists without spec.networkPolicy, opening the event ports
    to the picker's pods only and leaving the server port as open as before."""
    spec = {"model": {"uri": "hf://org/name"}, "router": {"enabled": True}}
    out = desired_children(isvc(spec), "img:1", service_monitors_served=False)
    (policy,) = [o for o in out.apply if o["kind"] == "NetworkPolicy"]
    assert ChildRef("networking.k8s.io/v1", "NetworkPolicy", "chat") not in out.remove
    server, picker = policy["spec"]["ingress"]
    assert server == {"ports": [{"port": c.SERVER_PORT, "protocol": "TCP"}]}, "open to all"
    picker_pods = {"matchLabels": {c.NAME_LABEL: "octavo-router", c.INSTANCE_LABEL: "chat"}}
    assert picker["from"] == [{"podSelector": picker_pods}]
    assert [p["port"] for p in picker["ports"]] == [c.SERVER_PORT, 5557, 5558]
    kv_ports = {5557, 5558}
    for rule in policy["spec"]["ingress"]:
        if kv_ports & {p.get("port") for p in rule["ports"]}:
            assert rule.get("from") == [{"podSelector": picker_pods}]
    multi = {**spec, "engine": {"nodes": 2}, "resources": {"gpu": 1}}
    (group,) = network_policy(isvc(multi))["spec"]["ingress"][2:]
    assert group["ports"] == [{"protocol": "TCP"}], "the group's own ports between its pods"
