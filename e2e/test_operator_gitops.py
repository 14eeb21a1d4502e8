"""GitOps with autoscaling: the user's manifest (no replicas, autoscaling on) applied with
`kubectl apply --server-side`, as Argo CD and Flux do, then again after the operator has
reconciled it and the autoscaler has written /scale: no conflict and no diff, because the
operator writes only status and kopf's annotations, never a field of the spec."""

from __future__ import annotations

import json
import time
from pathlib import Path

from e2e import isvc
from e2e.helpers import wait_for

NAME = "gitops"


def test_server_side_reapply_with_autoscaling_has_no_conflict_or_diff(
    operator, namespace, custom, apps, kubectl, tmp_path: Path
):
    body = isvc.manifest(
        NAME,
        {
            "resources": {"gpu": 0},
            "autoscaling": {"minReplicas": 2, "maxReplicas": 4, "metric": "requestsWaiting"},
        },
    )
    manifest = tmp_path / "isvc.json"
    manifest.write_text(json.dumps(body))
    apply = (
        "apply",
        "--server-side",
        "--field-manager",
        "argocd-controller",
        "-n",
        namespace,
        "-f",
        str(manifest),
    )
    kubectl(*apply)
    obj = isvc.wait_condition(custom, namespace, NAME, "Ready", "True", timeout=60)
    assert apps.read_namespaced_deployment(NAME, namespace).spec.replicas == 2
    # The HPA may already have raised the default 1 to minReplicas through /scale (the
    # autoscaler's field, recorded under the scale subresource); nothing else writes spec.
    entries = [e for e in obj["metadata"]["managedFields"] if e.get("subresource") != "scale"]
    spec_writers = [e["manager"] for e in entries if "f:spec" in json.dumps(e.get("fieldsV1"))]
    assert spec_writers == ["argocd-controller"], f"only the user writes the spec: {spec_writers}"

    kubectl("scale", "isvc", NAME, "-n", namespace, "--replicas=3")  # as the HPA does
    settled(custom, namespace, replicas=3)
    again = kubectl(*apply)  # no --force-conflicts: a conflict would fail here
    assert "serverside-applied" in again.stdout or "unchanged" in again.stdout, again.stdout
    assert_no_diff(kubectl, namespace, manifest)
    assert isvc.get(custom, namespace, NAME)["spec"]["replicas"] == 3, "the autoscaler's write"


def settled(custom, namespace: str, replicas: int) -> None:
    """Wait until the operator has rolled the new replica count out and reported it: a
    status write racing `kubectl diff` (which compares the whole live object, status and
    resourceVersion included) is not drift."""

    def done() -> bool:
        obj = isvc.get(custom, namespace, NAME)
        status = obj.get("status") or {}
        ready = isvc.condition(obj, "Ready").get("status") == "True"
        return ready and status.get("replicas") == status.get("readyReplicas") == replicas

    wait_for(
        done,
        timeout=60,
        what=f"{NAME} Ready with {replicas} replicas",
        describe=lambda: isvc.get(custom, namespace, NAME).get("status"),
    )


def assert_no_diff(kubectl, namespace: str, manifest: Path, attempts: int = 3) -> None:
    """`kubectl diff --server-side` of the user's manifest is empty. A drift the operator
    caused (a field of the spec rewritten) shows on every attempt; a status write landing
    between kubectl's read of the live object and its dry-run apply shows once."""
    for _ in range(attempts):
        diff = kubectl(
            "diff",
            "--server-side",
            "--field-manager",
            "argocd-controller",
            "-n",
            namespace,
            "-f",
            str(manifest),
            check=False,
        )
        if diff.returncode == 0:
            return
        assert diff.returncode == 1, f"kubectl diff failed:\n{diff.stdout}\n{diff.stderr}"
        time.sleep(2)
    raise AssertionError(
        f"the live object differs from the manifest ({attempts} tries):\n{diff.stdout}"
    )
