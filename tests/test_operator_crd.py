"""The CRD and RBAC rules: generated copies are current, and the schema has what users need.
(The apiserver's own verdict on specs is in e2e/test_operator_validation.py.)"""

from __future__ import annotations

import subprocess
import sys

from octavo_operator import generate
from octavo_operator.api.crd import custom_resource_definition
from octavo_operator.rbac import policy_rules


def test_generated_copies_are_current():
    proc = subprocess.run(
        [sys.executable, "-m", "octavo_operator.generate", "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert generate.stale() == []


def test_names_subresources_and_printer_columns():
    crd = custom_resource_definition()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "inferenceservices.octavo.dev"
    assert (spec["group"], spec["scope"]) == ("octavo.dev", "Namespaced")
    assert spec["names"]["kind"] == "InferenceService" and "isvc" in spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Ready", "Replicas", "Model", "URL", "Age"]


def test_defaults_are_in_the_schema():
    props = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]["properties"]
    assert props["engine"]["default"] == {
        "blockSize": 16,
        "gpuMemoryUtilization": 0.9,
        "enablePrefixCaching": True,
        "dtype": "auto",
        "tensorParallelSize": 1,
        "pipelineParallelSize": 1,
        "nodes": 1,
    }
    assert props["rollout"]["default"] == {
        "strategy": "RollingUpdate",
        "maxSurge": 0,
        "maxUnavailable": 1,
    }
    assert props["drain"]["default"] == {"preStopSeconds": 10, "terminationGracePeriodSeconds": 60}
    assert props["startup"]["default"] == {"timeoutSeconds": 1800}
    # The autoscaler starts from it through /scale: the operator never writes spec.replicas
    # (GitOps tools own the spec), and clamps the Deployment into the autoscaling range.
    assert props["replicas"]["default"] == 1


def test_rbac_rules_are_exact():
    rules = policy_rules()
    for r in rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]
    by_resource = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in rules}
    # delete: the endpoint picker's Deployment goes when spec.router is turned off
    assert by_resource[("apps", "deployments")] == {
        "get",
        "list",
        "watch",
        "create",
        "patch",
        "delete",
    }
    assert by_resource[("", "pods")] == {"get", "list", "watch"}
    assert by_resource[("octavo.dev", "inferenceservices/status")] == {"get", "patch", "update"}
    # Never list/watch: get the one Secret spec.apiKeySecretRef names, read to send its key
    # when loading LoRA adapters into the pods (the kubelet mounts it for the server); with
    # engine.nodes > 1 create the node key Secret once (no update: never rotated under
    # running pods) and delete it when engine.nodes goes back to 1.
    assert by_resource[("", "secrets")] == {"get", "create", "delete"}
    assert by_resource[("leaderworkerset.x-k8s.io", "leaderworkersets")] == {
        "get",
        "list",
        "watch",
        "create",
        "patch",
        "delete",
    }


def spec_properties() -> dict:
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root["properties"]["spec"]["properties"]


def walk(node: object) -> list[dict]:
    """Every schema node (dict) below NODE, NODE included."""
    if isinstance(node, list):
        return [d for item in node for d in walk(item)]
    if not isinstance(node, dict):
        return []
    return [node, *(d for value in node.values() for d in walk(value))]


def test_env_is_typed_as_core_v1_env_vars():
    env = spec_properties()["env"]
    assert not any(n.get("x-kubernetes-preserve-unknown-fields") for n in walk(env))
    entry = env["items"]
    assert entry["required"] == ["name"]
    assert set(entry["properties"]) == {"name", "value", "valueFrom"}
    sources = entry["properties"]["valueFrom"]["properties"]
    assert set(sources) == {"secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef"}
    assert sources["secretKeyRef"]["required"] == ["name", "key"]
    assert env["x-kubernetes-list-map-keys"] == ["name"]
    messages = [r["message"] for r in entry["x-kubernetes-validations"]]
    assert any("OCTAVO_API_KEY must not be a plain value" in m for m in messages)


def test_extra_args_rule_guards_every_operator_flag_and_its_abbreviations():
    engine = spec_properties()["engine"]
    guard, multi_node = [r for r in engine["x-kubernetes-validations"] if "extraArgs" in r["rule"]]
    for flag in ("--host", "--port", "--served-model-name", "--api-key"):
        assert f"'{flag}'" in guard["rule"]
        assert flag in guard["message"]
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"):
        assert f"'{flag}'" in multi_node["rule"] and flag in multi_node["message"]
        assert f"'{flag}'" not in guard["rule"]  # the first rule's message is unchanged
    assert "--node-join-timeout" not in multi_node["rule"], "left to extraArgs"
    # a prefix of a guarded flag (--po, --api-k=KEY) is refused as well as the flag itself,
    # and underscores read as dashes (the server takes vLLM's --api_key spelling)
    for rule in (guard, multi_node):
        assert "f.startsWith(a.split('=')[0].replace('_', '-'))" in rule["rule"]
        assert "abbreviation" in rule["message"]


def test_namespaced_and_cluster_scoped_rules_make_up_the_cluster_role():
    from octavo_operator.rbac import cluster_scoped_rules, namespaced_rules

    assert policy_rules() == [*namespaced_rules(), *cluster_scoped_rules()]
    cluster_resources = {r["resources"][0] for r in cluster_scoped_rules()}
    assert cluster_resources == {"customresourcedefinitions", "namespaces"}, "no Role grants"
    assert all(r["verbs"] == ["get", "list", "watch"] for r in cluster_scoped_rules())
    resources = {r["resources"][0] for r in namespaced_rules()}
    assert {"inferenceservices", "deployments", "networkpolicies", "events"} <= resources
    assert "customresourcedefinitions" not in resources
