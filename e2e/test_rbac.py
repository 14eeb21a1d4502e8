"""RBAC is enforced: a ServiceAccount token gets 403 until a Role and RoleBinding allow it."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client, config

from e2e import cluster as e2e_cluster
from e2e.helpers import deployment, wait_for


def _status(call) -> int:
    try:
        call()
    except client.ApiException as exc:
        return exc.status
    return 200


def test_service_account_needs_role_binding(
    cluster: e2e_cluster.Cluster,
    namespace: str,
    core: client.CoreV1Api,
    rbac: client.RbacAuthorizationV1Api,
    tmp_path: Path,
):
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    kubeconfig = e2e_cluster.service_account_kubeconfig(
        cluster, namespace, "reader", tmp_path / "reader.kubeconfig"
    )
    sa_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        sa_apps = client.AppsV1Api(sa_client)

        with pytest.raises(client.ApiException) as denied:
            sa_apps.list_namespaced_deployment(namespace)
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:reader" in denied.value.body

        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "deployment-reader"},
                "rules": [
                    {
                        "apiGroups": ["apps"],
                        "resources": ["deployments"],
                        "verbs": ["get", "list", "watch"],
                    }
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "reader-reads-deployments"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "deployment-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        )
        # The authorizer sees new bindings through an informer: allow it a moment.
        wait_for(
            lambda: _status(lambda: sa_apps.list_namespaced_deployment(namespace)) == 200,
            timeout=30,
            what="the RoleBinding to take effect",
        )
        assert sa_apps.list_namespaced_deployment(namespace).items == []
        # Only what the Role grants: other namespaces and other verbs stay forbidden.
        assert _status(lambda: sa_apps.list_namespaced_deployment("default")) == 403
        forbidden_create = deployment("not-allowed", replicas=1)
        assert (
            _status(lambda: sa_apps.create_namespaced_deployment(namespace, forbidden_create))
            == 403
        )
    finally:
        sa_client.close()
