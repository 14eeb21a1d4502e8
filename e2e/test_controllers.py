"""Controllers the operator relies on beyond workloads: namespace and service-account tokens."""

from __future__ import annotations

import secrets

from kubernetes import client

from e2e.helpers import wait_for


def test_namespace_controller_finishes_deletion(core: client.CoreV1Api):
    name = f"e2e-ns-deletion-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": name, "labels": {"octavo.dev/e2e": "true"}}})
    core.create_namespaced_config_map(name, {"metadata": {"name": "leftover"}, "data": {"k": "v"}})
    core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, timeout=60, what=f"namespace {name} to be deleted with its contents")


def test_service_account_token_controller_fills_legacy_token_secret(
    namespace: str, core: client.CoreV1Api
):
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "legacy"}})
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {
                "name": "legacy-token",
                "annotations": {"kubernetes.io/service-account.name": "legacy"},
            },
            "type": "kubernetes.io/service-account-token",
        },
    )

    def filled() -> dict | None:
        data = core.read_namespaced_secret("legacy-token", namespace).data or {}
        return data if {"token", "ca.crt", "namespace"} <= set(data) else None

    data = wait_for(filled, timeout=30, what="the token controller to fill the Secret")
    assert data["token"]
