"""The chart's ValidatingAdmissionPolicy on a real apiserver: what a user who may create an
InferenceService may make the operator do with its own rights (the confused deputy).

Each refused spec below is a reproduction: before the policy, the apiserver admitted it and
the operator built a pod that ran a foreign image, read a Secret, mounted someone else's
claim or used scheduling rights its author did not have.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from e2e import isvc
from e2e.admission_policy import refusal, render, wait_until_enforced
from e2e.operator_process import install_crd

VALUES = {
    "allowedImageRegistries": ["registry.invalid/octavo/"],
    "allowedEnvSecrets": ["hf-token"],
    "allowedEnvConfigMaps": [],
    "allowedClaims": ["weights", "shared-*"],
    "allowedSchedulingFields": ["nodeSelector"],
}


def secret_env(secret: str) -> list[dict]:
    return [{"name": "X", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]


REFUSED = {
    "foreign-registry": ({"image": "docker.io/evil/miner:1"}, "must come from an allowed registry"),
    "lookalike-registry": (
        {"image": "registry.invalid/octavo-evil/server:1"},
        "must come from an allowed registry",
    ),
    "env-reads-a-secret": ({"env": secret_env("db-password")}, "only these Secrets"),
    "env-reads-a-config-map": (
        {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]},
        "only these ConfigMaps",
    ),
    "cache-on-an-unlisted-claim": ({"cache": {"claimName": "payroll"}}, "only these claims"),
    "model-on-an-unlisted-claim": ({"model": {"uri": "pvc://payroll/db"}}, "only these claims"),
    "adapter-on-an-unlisted-claim": (
        {
            "adapters": [
                {"name": "ok", "uri": "pvc://shared-loras/a"},
                {"name": "sneaky", "uri": "pvc://payroll/db"},
            ]
        },
        "only these claims",
    ),
    "tolerations": (
        {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
        "spec.tolerations may not be set",
    ),
    "affinity": ({"affinity": {"nodeAffinity": {}}}, "spec.affinity may not be set"),
    "priority-class": (
        {"priorityClassName": "system-node-critical"},
        "spec.priorityClassName may not be set",
    ),
    "runtime-class": ({"runtimeClassName": "privileged"}, "spec.runtimeClassName may not be set"),
}

PERMITTED = {
    "image": isvc.FAKE_IMAGE,
    "env": [
        *secret_env("hf-token"),
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ],
    "model": {"uri": "pvc://shared-models/llama"},
    "cache": {"claimName": "weights"},
    "nodeSelector": {"gpu": "h100"},
    "adapters": [
        {"name": "sql", "uri": "pvc://shared-loras/sql"},
        {"name": "hub", "uri": "hf://o/n"},
    ],
}


@pytest.fixture
def policy(cluster, namespace, apiext, helm, kubectl, custom, tmp_path) -> Iterator[Path]:
    """The chart's policy with VALUES, bound to this test's namespace, in force."""
    install_crd(apiext)
    path = render(helm, f"vap-{secrets.token_hex(3)}", namespace, VALUES, tmp_path)
    kubectl("apply", "-f", str(path))
    try:
        wait_until_enforced(custom, namespace, REFUSED["foreign-registry"][0])
        yield path
    finally:
        kubectl("delete", "-f", str(path), "--ignore-not-found")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_policy_refuses(policy, namespace, custom, case):
    spec, expected = REFUSED[case]
    message = refusal(custom, namespace, isvc.manifest("refused", spec))
    assert message is not None, "admitted"
    assert "ValidatingAdmissionPolicy" in message and expected in message, message


def test_permitted_spec_is_created(policy, namespace, custom):
    created = isvc.create(custom, namespace, isvc.manifest("permitted", PERMITTED))
    assert created["spec"]["cache"] == {"claimName": "weights", "accessMode": "ReadWriteOnce"}
    default_image = isvc.manifest("default-image")
    del default_image["spec"]["image"]
    assert refusal(custom, namespace, default_image) is None, "the operator's default image"


def test_objects_admitted_before_the_policy_are_not_locked(
    cluster, namespace, apiext, helm, kubectl, custom, tmp_path
):
    """Only a new or changed spec is judged: an older object keeps its labels, annotations and
    status writable (the operator patches them), and a spec change must obey the policy."""
    install_crd(apiext)
    isvc.create(custom, namespace, isvc.manifest("older", REFUSED["tolerations"][0]))
    path = render(helm, f"vap-{secrets.token_hex(3)}", namespace, VALUES, tmp_path)
    kubectl("apply", "-f", str(path))
    try:
        wait_until_enforced(custom, namespace, REFUSED["tolerations"][0])
        isvc.patch(custom, namespace, "older", {"metadata": {"labels": {"team": "a"}}})
        with pytest.raises(client.ApiException) as refused:
            isvc.patch(custom, namespace, "older", {"spec": {"replicas": 2}})
        assert "spec.tolerations may not be set" in json.loads(refused.value.body)["message"]
    finally:
        kubectl("delete", "-f", str(path), "--ignore-not-found")
