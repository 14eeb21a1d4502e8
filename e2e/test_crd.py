"""A CRD's OpenAPI schema and CEL rule are enforced by the apiserver itself."""

from __future__ import annotations

import json
import secrets

import pytest
from kubernetes import client

from e2e.helpers import wait_for

CEL_MESSAGE = "minReplicas must not be greater than maxReplicas"


def _crd(group: str) -> dict:
    spec_schema = {
        "type": "object",
        "required": ["model"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "minReplicas": {"type": "integer", "minimum": 0},
            "maxReplicas": {"type": "integer", "minimum": 1, "maximum": 8},
        },
        "x-kubernetes-validations": [
            {"rule": "self.minReplicas <= self.maxReplicas", "message": CEL_MESSAGE}
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": spec_schema},
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture
def widget_group(apiext: client.ApiextensionsV1Api):
    group = f"t{secrets.token_hex(3)}.e2e.octavo.dev"
    apiext.create_custom_resource_definition(_crd(group))

    def established() -> bool:
        crd = apiext.read_custom_resource_definition(f"widgets.{group}")
        conditions = (crd.status and crd.status.conditions) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, timeout=30, what="the CRD to be Established")
    yield group
    apiext.delete_custom_resource_definition(f"widgets.{group}")


def _widget(group: str, name: str, **spec) -> dict:
    return {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def _create_error(custom: client.CustomObjectsApi, group: str, ns: str, body: dict) -> dict:
    with pytest.raises(client.ApiException) as refused:
        custom.create_namespaced_custom_object(group, "v1", ns, "widgets", body)
    assert refused.value.status == 422, refused.value.body
    return json.loads(refused.value.body)


def test_crd_schema_and_cel_rule_refuse_invalid_objects(
    namespace: str, custom: client.CustomObjectsApi, widget_group: str
):
    group = widget_group
    good = _widget(group, "good", model="smollm2", minReplicas=1, maxReplicas=2)

    def created() -> bool:  # the new resource is served a moment after Established
        try:
            custom.create_namespaced_custom_object(group, "v1", namespace, "widgets", good)
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    wait_for(created, timeout=30, what="the first Widget to be accepted")

    # The CEL rule, with the apiserver's own wording around the rule's message.
    status = _create_error(
        custom, group, namespace, _widget(group, "bad", model="m", minReplicas=3, maxReplicas=2)
    )
    assert status["reason"] == "Invalid"
    assert CEL_MESSAGE in status["message"]
    assert status["message"].startswith(f'Widget.{group} "bad" is invalid')
    causes = status["details"]["causes"]
    assert any(c["field"] == "spec" and CEL_MESSAGE in c["message"] for c in causes), causes

    # The OpenAPI schema: a bound and a required field.
    status = _create_error(
        custom, group, namespace, _widget(group, "big", model="m", minReplicas=1, maxReplicas=9)
    )
    assert "spec.maxReplicas" in status["message"]
    assert "should be less than or equal to 8" in status["message"]
    status = _create_error(custom, group, namespace, _widget(group, "nomodel", maxReplicas=1))
    assert "spec.model: Required value" in status["message"]

    names = [
        o["metadata"]["name"]
        for o in custom.list_namespaced_custom_object(group, "v1", namespace, "widgets")["items"]
    ]
    assert names == ["good"]
