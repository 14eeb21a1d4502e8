"""Static checks of the chart's security objects (no cluster): the ValidatingAdmissionPolicy
on InferenceServices, and the namespaced RBAC used with operator.watchNamespaces. What the
apiserver does with them is proven in test_admission_policy.py and
test_operator_namespaced_rbac.py."""

from __future__ import annotations

import pytest
import yaml

from e2e.cluster import build
from e2e.test_chart_static import (
    CHART,
    NAMESPACE,
    OPERATOR,
    Helm,
    Obj,
    find,
    find_all,
    offline_helm,
    render,
    template_args,
)

POLICY = "octavo-inferenceservices"
RULES = CHART / "files" / "rbac"
SCHEDULING = ["nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName"]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm from the e2e build cache, offline (no cluster)."""
    binary = build.ensure_built(("helm",))["helm"]
    return offline_helm(binary, tmp_path_factory.mktemp("helm-home"))


def load_rules(name: str) -> list[Obj]:
    return yaml.safe_load((RULES / name).read_text())


def messages(policy: Obj) -> list[str]:
    return [v["message"] for v in policy["spec"]["validations"]]


def variables(policy: Obj) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def test_policy_is_on_by_default_and_denies(helm: Helm) -> None:
    objects = render(helm)
    policy = find(objects, "ValidatingAdmissionPolicy", POLICY)
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["octavo.dev"], ["inferenceservices"])
    assert rule["operations"] == ["CREATE", "UPDATE"]
    (changed,) = policy["spec"]["matchConditions"]
    assert changed["expression"] == "request.operation == 'CREATE' || object.spec != oldObject.spec"
    binding = find(objects, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}


def test_policy_defaults_are_safe(helm: Helm) -> None:
    policy = find(render(helm), "ValidatingAdmissionPolicy", POLICY)
    values = variables(policy)
    assert values["allowedImageRegistries"] == "['ghcr.io/octavo-dev/']"
    assert values["allowedEnvSecrets"] == "['hf-token']", "the examples' gated-model token"
    assert values["allowedEnvConfigMaps"] == "['*']"
    assert values["allowedClaims"] == "[]"
    found = messages(policy)
    assert any(
        "only these Secrets (admissionPolicy.allowedEnvSecrets): hf-token" in m for m in found
    )
    assert any("only these claims (admissionPolicy.allowedClaims): none" in m for m in found)
    refused = [f for f in SCHEDULING if any(f"spec.{f} may not be set" in m for m in found)]
    assert refused == SCHEDULING[1:], "nodeSelector only narrows placement: allowed"


def test_policy_values_are_baked_into_the_rules(helm: Helm) -> None:
    objects = render(
        helm,
        "--set",
        "admissionPolicy.allowedImageRegistries={registry.corp/ml/,ghcr.io/octavo-dev/}",
        "--set",
        "admissionPolicy.allowedEnvSecrets={hf-token,team-*}",
        "--set",
        "admissionPolicy.allowedClaims={*}",
        "--set",
        "admissionPolicy.allowedSchedulingFields={tolerations,nodeSelector}",
        "--set",
        "admissionPolicy.namespaceSelector.matchLabels.tenant=ml",
    )
    policy = find(objects, "ValidatingAdmissionPolicy", POLICY)
    values = variables(policy)
    assert values["allowedImageRegistries"] == "['registry.corp/ml/', 'ghcr.io/octavo-dev/']"
    assert values["allowedEnvSecrets"] == "['hf-token', 'team-*']"
    assert values["allowedClaims"] == "['*']"
    found = " ".join(messages(policy))
    assert "spec.tolerations" not in found and "spec.nodeSelector" not in found
    assert "spec.affinity may not be set" in found
    binding = find(objects, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"tenant": "ml"}}
    }


def test_policy_can_be_left_out(helm: Helm) -> None:
    objects = render(helm, "--set", "admissionPolicy.enabled=false")
    assert find_all(objects, "ValidatingAdmissionPolicy") == []
    assert find_all(objects, "ValidatingAdmissionPolicyBinding") == []


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        # a registry without its trailing / would admit lookalikes (ghcr.io/octavo-dev-evil/)
        ("admissionPolicy.allowedImageRegistries={ghcr.io/octavo-dev}", "allowedImageRegistries"),
        ("admissionPolicy.allowedEnvSecrets={a'b}", "allowedEnvSecrets"),
        ("admissionPolicy.allowedClaims={Weights}", "allowedClaims"),
        ("admissionPolicy.allowedSchedulingFields={hostNetwork}", "allowedSchedulingFields"),
    ],
)
def test_schema_refuses_values_that_would_break_the_rules(
    helm: Helm, setting: str, field: str
) -> None:
    proc = helm(*template_args("--set", setting), check=False)
    assert proc.returncode != 0, proc.stdout
    assert f"/admissionPolicy/{field}" in proc.stderr, proc.stderr


def test_watch_namespaces_gives_roles_per_namespace_and_a_small_cluster_role(
    helm: Helm,
) -> None:
    objects = render(helm, "--set", "operator.watchNamespaces={team-a,team-b}")
    assert find(objects, "ClusterRole", OPERATOR)["rules"] == load_rules(
        "cluster-scoped-rules.yaml"
    )
    assert find(objects, "ClusterRoleBinding", OPERATOR)["roleRef"]["kind"] == "ClusterRole"
    lease_role, *roles = find_all(objects, "Role")
    assert lease_role["metadata"]["namespace"] == NAMESPACE, "the Lease: release namespace"
    assert lease_role["rules"] == load_rules("leader-election-rules.yaml")
    assert [r["metadata"]["namespace"] for r in roles] == ["team-a", "team-b"]
    for role in roles:
        assert role["rules"] == load_rules("namespaced-rules.yaml")
    _, *bindings = find_all(objects, "RoleBinding")
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": OPERATOR,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
        ]


def test_generated_rule_files_split_the_cluster_role() -> None:
    everything = load_rules("clusterrole-rules.yaml")
    parts = load_rules("namespaced-rules.yaml") + load_rules("cluster-scoped-rules.yaml")
    assert everything == parts
