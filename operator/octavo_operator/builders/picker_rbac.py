"""The endpoint picker's ServiceAccount, Role and RoleBinding (spec.router).

The rules are the llm-d router v0.10.0's own (deploy/components/inference-gateway/rbac.yaml
and its chart), cut to this namespace: read pods and InferencePools (its datastore), read
InferenceObjectives and InferenceModelRewrites (watched only where their CRDs exist, in both
API groups v0.10.0 reads), and with more than one replica the Lease and Events of leader
election. TokenReviews and SubjectAccessReviews (authenticated /metrics) are cluster-scoped,
so the picker runs with --metrics-endpoint-auth=false instead. The operator holds every one
of these rights itself (rbac.py): Kubernetes lets it grant only what it has.
"""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .picker import picker_metadata

READ = ["get", "list", "watch"]
LEASE_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]
OBJECTIVE_GROUPS = ("llm-d.ai", "inference.networking.x-k8s.io")


def picker_rules(leader_election: bool) -> list[dict[str, Any]]:
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": READ},
        {
            "apiGroups": [c.INFERENCE_POOL_API.split("/")[0]],
            "resources": ["inferencepools"],
            "verbs": READ,
        },
        {
            "apiGroups": list(OBJECTIVE_GROUPS),
            "resources": ["inferenceobjectives", "inferencemodelrewrites"],
            "verbs": READ,
        },
    ]
    if leader_election:
        rules += [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": LEASE_VERBS},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ]
    return rules


def picker_service_account(isvc: InferenceService) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": picker_metadata(isvc)}


def picker_role(isvc: InferenceService) -> dict[str, Any]:
    router = isvc.router
    assert router is not None
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": picker_metadata(isvc),
        "rules": picker_rules(router.picker.replicas > 1),
    }


def picker_role_binding(isvc: InferenceService) -> dict[str, Any]:
    subject = {"kind": "ServiceAccount", "name": isvc.picker_name, "namespace": isvc.namespace}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": picker_metadata(isvc),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": isvc.picker_name,
        },
        "subjects": [subject],
    }
