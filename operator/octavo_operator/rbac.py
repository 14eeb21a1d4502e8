"""The exact API rights the operator needs, next to the code that uses them.

`python -m octavo_operator.generate` writes these rules for the Helm chart's ClusterRole
(all of them), or, when the chart's operator.watchNamespaces is set, for a Role in each
watched namespace (the namespaced ones) and a small ClusterRole (the cluster-scoped ones);
the e2e tests run the operator under exactly that role, so a missing right fails a test
and an unneeded one is visible here.
"""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.builders.picker_rbac import LEASE_VERBS, OBJECTIVE_GROUPS, READ

WATCH = ["get", "list", "watch"]
# Server-side apply is a PATCH that may create the object, which RBAC checks as `create`.
APPLY = ["create", "patch"]


def policy_rules() -> list[dict[str, Any]]:
    """Every rule: a ClusterRole's, when the operator watches all namespaces."""
    return [*namespaced_rules(), *cluster_scoped_rules()]


def namespaced_rules() -> list[dict[str, Any]]:
    """Rights in a watched namespace: a Role's there when the operator watches only some."""
    return [
        # The custom resource: watched, its spec.replicas seeded for autoscaling, status
        # written; kopf records its progress in annotations (a patch of the object).
        _rule(c.GROUP, c.PLURAL, [*WATCH, "patch"]),
        _rule(c.GROUP, f"{c.PLURAL}/status", ["get", "patch", "update"]),
        # Scale to zero: the idle scaler sets replicas to 0 and the activator back to 1,
        # through /scale as the HPA does; while at zero an EndpointSlice of the service's
        # Service points at the activator.
        _rule(c.GROUP, f"{c.PLURAL}/scale", ["get", "patch"]),
        _rule("discovery.k8s.io", "endpointslices", [*APPLY, "delete"]),
        # Children, created by server-side apply and watched for drift and status; the
        # endpoint picker's Deployment and Service are deleted when spec.router turns off.
        _rule("apps", "deployments", [*WATCH, *APPLY, "delete"]),
        _rule("", "services", [*WATCH, *APPLY, "delete"]),
        _rule("", "persistentvolumeclaims", [*WATCH, *APPLY]),
        # Optional children: also deleted when the spec turns them off.
        _rule("policy", "poddisruptionbudgets", [*WATCH, *APPLY, "delete"]),
        _rule("autoscaling", "horizontalpodautoscalers", [*WATCH, *APPLY, "delete"]),
        _rule("networking.k8s.io", "networkpolicies", [*WATCH, *APPLY, "delete"]),
        _rule("monitoring.coreos.com", "servicemonitors", [*WATCH, *APPLY, "delete"]),
        # spec.prefill: the prefill pool's pods, which no Service of the service selects.
        _rule("monitoring.coreos.com", "podmonitors", [*WATCH, *APPLY, "delete"]),
        # The list of LoRA adapters a starting pod loads (spec.adapters), and the endpoint
        # picker's config (spec.router).
        _rule("", "configmaps", [*WATCH, *APPLY, "delete"]),
        *router_rules(),
        # engine.nodes > 1: the LeaderWorkerSet in place of the Deployment (its status is
        # read from the object; replicas go through the InferenceService's /scale, not the
        # LWS's), deleted when engine.nodes goes back to 1.
        _rule("leaderworkerset.x-k8s.io", "leaderworkersets", [*WATCH, *APPLY, "delete"]),
        # The API key of spec.apiKeySecretRef, sent when loading adapters into ready pods;
        # with engine.nodes > 1 the node key Secret, created once (never listed, never
        # updated) and deleted when engine.nodes goes back to 1.
        _rule("", "secrets", ["get", "create", "delete"]),
        # Pods are read to explain what a Deployment's status does not (unschedulable).
        _rule("", "pods", WATCH),
        # Events on the InferenceService for every condition change.
        _rule("", "events", ["create", "patch"]),
        _rule("events.k8s.io", "events", ["create", "patch"]),
    ]


def cluster_scoped_rules() -> list[dict[str, Any]]:
    """Rights that no Role can grant: kept in a small ClusterRole in every mode."""
    return [
        # kopf checks which CRDs exist when it starts (and whether ServiceMonitors do).
        _rule("apiextensions.k8s.io", "customresourcedefinitions", WATCH),
        # kopf lists and watches namespaces to find the ones it was told to watch (their
        # names only); refused, it retries the list for about 54 s before acting at all.
        _rule("", "namespaces", WATCH),
    ]


def _rule(group: str, resource: str, verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


def leader_election_rules() -> list[dict[str, Any]]:
    """Rights in the operator's own namespace (a Role there): the Lease its replicas share."""
    return [_rule("coordination.k8s.io", "leases", ["get", "create", "update"])]


def router_rules() -> list[dict[str, Any]]:
    """spec.router: the InferencePool, the endpoint picker's ServiceAccount, Role and
    RoleBinding (applied, watched for drift, deleted when turned off), and every right that
    Role grants the picker (builders/picker_rbac.py): Kubernetes lets the operator grant only
    rights it holds. Pods and events are granted above already."""
    return [
        _rule("inference.networking.k8s.io", "inferencepools", [*WATCH, *APPLY, "delete"]),
        _rule("", "serviceaccounts", [*WATCH, *APPLY, "delete"]),
        _rule("rbac.authorization.k8s.io", "roles", [*WATCH, *APPLY, "delete"]),
        _rule("rbac.authorization.k8s.io", "rolebindings", [*WATCH, *APPLY, "delete"]),
        *(
            _rule(group, kind, READ)
            for group in OBJECTIVE_GROUPS
            for kind in ("inferenceobjectives", "inferencemodelrewrites")
        ),
        _rule("coordination.k8s.io", "leases", LEASE_VERBS),
    ]
