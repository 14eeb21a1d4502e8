"""The chart with operator.watchNamespaces: a Role and RoleBinding per watched namespace and a
ClusterRole that only reads CRDs and namespaces. The operator, acting as the chart's
ServiceAccount under exactly those objects, reconciles a service in its namespace at once
(kopf refused the namespace list retries it for ~54 s) and has no rights elsewhere."""

from __future__ import annotations

import secrets

import yaml

from e2e import isvc
from e2e.cluster.paths import REPO_ROOT
from e2e.operator_process import OperatorProcess, install_crd

CHART = REPO_ROOT / "charts/octavo"
TEMPLATES = ("templates/serviceaccount.yaml", "templates/rbac.yaml")


def render_rbac(helm, release: str, release_ns: str, watched: str) -> list[dict]:
    only = [arg for template in TEMPLATES for arg in ("--show-only", template)]
    text = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        release_ns,
        *only,
        "--set",
        f"operator.watchNamespaces={{{watched}}}",
    ).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def can_i(kubectl, user: str, verb: str, resource: str, *scope: str) -> bool:
    """`kubectl auth can-i` as USER; SCOPE is ("-n", NAMESPACE) or ("--all-namespaces",)."""
    proc = kubectl("auth", "can-i", verb, resource, *scope, "--as", user, check=False)
    return proc.stdout.strip() == "yes"


def test_operator_runs_under_namespaced_rbac(
    cluster, no_other_operator, namespace, helm, kubectl, apiext, core, custom, tmp_path
):
    install_crd(apiext)
    release_ns = f"octavo-ns-rbac-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": release_ns}})
    objects = render_rbac(helm, f"scoped-{secrets.token_hex(3)}", release_ns, namespace)
    by_kind = {o["kind"]: o for o in objects}
    assert sorted(by_kind) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    assert by_kind["Role"]["metadata"]["namespace"] == namespace
    cluster_rules = by_kind["ClusterRole"]["rules"]
    assert {r for rule in cluster_rules for r in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }
    assert {v for rule in cluster_rules for v in rule["verbs"]} == {"get", "list", "watch"}
    path = tmp_path / "rbac.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    kubectl("apply", "-f", str(path))
    account = by_kind["ServiceAccount"]["metadata"]["name"]
    user = f"system:serviceaccount:{release_ns}:{account}"
    operator = OperatorProcess(
        cluster, tmp_path / "operator", (release_ns, account), args=("--namespace", namespace)
    )
    operator.start()
    try:
        isvc.create(custom, namespace, isvc.manifest("scoped", {"replicas": 1}))
        obj = isvc.wait_condition(custom, namespace, "scoped", "Ready", "True", timeout=25)
        assert obj["status"]["readyReplicas"] == 1
        assert "Not enough permissions" not in operator.tail(400)
        assert can_i(kubectl, user, "patch", "deployments", "-n", namespace)
        assert not can_i(kubectl, user, "patch", "deployments", "-n", release_ns)
        assert not can_i(kubectl, user, "list", "inferenceservices.octavo.dev", "-n", "default")
        assert not can_i(kubectl, user, "list", "pods", "--all-namespaces")
    finally:
        operator.stop()
        kubectl("delete", "-f", str(path), "--ignore-not-found")
        core.delete_namespace(release_ns)
