"""A ServiceMonitor is created only when asked for and when the Prometheus Operator's CRD
is served; turning it off deletes it."""

from __future__ import annotations

import pytest
from kubernetes import client

from e2e import isvc
from e2e.helpers import wait_for

MONITORING = ("monitoring.coreos.com", "v1", "servicemonitors")


CRD_NAME = "servicemonitors.monitoring.coreos.com"


def served(apiext: client.ApiextensionsV1Api) -> bool:
    return any(c.metadata.name == CRD_NAME for c in apiext.list_custom_resource_definition().items)


def install_service_monitor_crd(apiext: client.ApiextensionsV1Api) -> None:
    """The ServiceMonitor CRD (schema left open: only its existence matters here)."""
    body = {
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {
                "plural": "servicemonitors",
                "singular": "servicemonitor",
                "kind": "ServiceMonitor",
                "listKind": "ServiceMonitorList",
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    apiext.create_custom_resource_definition(body)


@pytest.fixture(autouse=True)
def remove_service_monitor_crd(apiext: client.ApiextensionsV1Api):
    yield
    if served(apiext):
        apiext.delete_custom_resource_definition(CRD_NAME)


def monitors(custom: client.CustomObjectsApi, namespace: str) -> list[dict]:
    try:
        found = custom.list_namespaced_custom_object(*MONITORING[:2], namespace, MONITORING[2])
    except client.ApiException as error:
        if error.status == 404:  # the API is not served yet
            return []
        raise
    return found["items"]


def test_service_monitor_follows_the_spec(operator, namespace, custom, apiext):
    spec = {"replicas": 1, "monitoring": {"serviceMonitor": True, "interval": "30s"}}
    isvc.create(custom, namespace, isvc.manifest("watched", spec))
    isvc.wait_condition(custom, namespace, "watched", "Ready", "True")
    assert not served(apiext)  # no Prometheus Operator yet: nothing to create
    install_service_monitor_crd(apiext)  # it arrives after the service
    found = wait_for(lambda: monitors(custom, namespace), timeout=20, what="a ServiceMonitor")
    (monitor,) = found
    endpoint = monitor["spec"]["endpoints"][0]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http", "/metrics", "30s")
    assert monitor["metadata"]["ownerReferences"][0]["name"] == "watched"
    isvc.patch(custom, namespace, "watched", {"spec": {"monitoring": {"serviceMonitor": False}}})
    wait_for(lambda: not monitors(custom, namespace), timeout=20, what="the monitor's deletion")
    isvc.wait_condition(custom, namespace, "watched", "Ready", "True")
