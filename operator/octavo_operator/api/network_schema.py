"""`spec.networkPolicy`: who may reach the server pods, as a NetworkPolicy the operator owns."""

from __future__ import annotations

from .schema import Schema, free_form, obj, string


def peer_schema() -> Schema:
    """A networking.k8s.io/v1 NetworkPolicyPeer."""
    return obj(
        "a NetworkPolicyPeer: pods, namespaces (label selectors) or an IP block",
        {
            "namespaceSelector": free_form("namespaces by label (a LabelSelector)"),
            "podSelector": free_form("pods by label (a LabelSelector)"),
            "ipBlock": obj(
                "addresses outside the cluster",
                {
                    "cidr": string("e.g. 10.0.0.0/8"),
                    "except": {"type": "array", "items": {"type": "string"}},
                },
                required=["cidr"],
            ),
        },
    )


def peers(description: str) -> Schema:
    return {"type": "array", "description": description, "items": peer_schema(), "maxItems": 32}


def network_policy_schema() -> Schema:
    return obj(
        "A NetworkPolicy for the server pods: ingress only to port 8000, only from the listed "
        "peers; egress stays open. Needs a CNI that enforces NetworkPolicies.",
        {
            "enabled": {
                "type": "boolean",
                "description": "create the NetworkPolicy (deleted when turned off; with "
                "spec.router there is one anyway, admitting only the endpoint picker to the "
                "KV-event ports and anyone to port 8000)",
                "default": False,
            },
            "allowFrom": peers("clients allowed in (default: pods of the same namespace)"),
            "allowScrapeFrom": peers("also allowed in, for /metrics, e.g. Prometheus' namespace"),
        },
    )
