"""The built tools report the pinned versions and work against the cluster."""

from __future__ import annotations

import json
import subprocess

from e2e import cluster as e2e_cluster
from e2e.cluster import versions
from e2e.helpers import wait_for


def test_kubectl_and_server_report_pinned_version(kubectl):
    out = json.loads(kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == versions.KUBERNETES
    assert out["serverVersion"]["gitVersion"] == versions.KUBERNETES
    assert out["serverVersion"]["minor"] == versions.KUBERNETES.split(".")[1]


def test_etcd_and_kwok_versions(cluster: e2e_cluster.Cluster):
    etcd = subprocess.run(
        [cluster.binary("etcd"), "--version"], capture_output=True, text=True, timeout=30
    )
    assert f"etcd Version: {versions.ETCD.lstrip('v')}" in etcd.stdout
    kwok = subprocess.run(
        [cluster.binary("kwok"), "--version"], capture_output=True, text=True, timeout=30
    )
    assert versions.KWOK.lstrip("v") in kwok.stdout + kwok.stderr


def test_helm_installs_a_chart_that_becomes_ready(helm, kubectl, namespace, tmp_path):
    assert helm("version", "--template", "{{.Version}}").stdout.strip() == versions.HELM
    chart = tmp_path / "demo"
    helm("create", str(chart))
    helm("lint", "--strict", str(chart))
    helm("install", "demo", str(chart), "-n", namespace, "--wait", "--timeout", "90s")
    pods = json.loads(
        kubectl(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=demo", "-o", "json"
        ).stdout
    )["items"]
    assert pods and all(p["status"]["phase"] == "Running" for p in pods)
    helm("uninstall", "demo", "-n", namespace, "--wait", "--timeout", "60s")
    wait_for(
        lambda: (
            not json.loads(kubectl("get", "deploy", "-n", namespace, "-o", "json").stdout)["items"]
        ),
        timeout=30,
        what="helm uninstall to remove the Deployment",
    )


def test_the_endpoint_picker_is_the_pinned_llm_d_router():
    """The EPP built from the module proxy's zip (pinned by SHA-256) runs and has the flags
    the operator's picker Deployment passes."""
    from e2e.cluster import build

    binary = build.ensure_built(("epp",))["epp"]
    info = json.loads((binary.parent / "build-info.json").read_text())
    assert info["version"] == versions.LLM_D_ROUTER
    flags = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    for flag in (
        "--pool-name",
        "--pool-namespace",
        "--config-file",
        "--grpc-health-port",
        "--secure-serving",
        "--metrics-endpoint-auth",
    ):
        assert flag in flags.stdout + flags.stderr, flag
