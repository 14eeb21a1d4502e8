"""GitOps with autoscaling: the user's manifest (no replicas, autoscaling on) applied with
`kubectl apply --server-side`, as Argo CD and Flux do, then again after the operator has
reconciled it and the autoscaler has written /scale: no conflict and no diff, because the
operator writes only status and kopf's annotations, never a field of the spec."""

from __future__ import annotations

import json
from pathlib import Path

from e2e import isvc

NAME = "gitops"


def test_server_side_reapply_with_autoscaling_has_no_conflict_or_diff(
    operator, namespace, custom, apps, kubectl, tmp_path: Path
):
    body = isvc.manifest(NAME, {
        "resources": {"gpu": 0},
        "autoscaling": {"minReplicas": 2, "maxReplicas": 4, "metric": "requestsWaiting"},
    })  # fmt: skip
    manifest = tmp_path / "isvc.json"
    manifest.write_text(json.dumps(body))
    apply = ("apply", "--server-side", "--field-manager", "argocd-controller", "-n", namespace,
             "-f", str(manifest))  # fmt: skip
    kubectl(*apply)
    obj = isvc.wait_condition(custom, namespace, NAME, "Ready", "True", timeout=60)
    assert apps.read_namespaced_deployment(NAME, namespace).spec.replicas == 2
    managers = {entry["manager"]: entry for entry in obj["metadata"]["managedFields"]}
    spec_writers = [m for m, e in managers.items() if "f:spec" in json.dumps(e.get("fieldsV1"))]
    assert spec_writers == ["argocd-controller"], f"only the user writes the spec: {spec_writers}"

    kubectl("scale", "isvc", NAME, "-n", namespace, "--replicas=3")  # as the HPA does
    again = kubectl(*apply)  # no --force-conflicts: a conflict would fail here
    assert "serverside-applied" in again.stdout or "unchanged" in again.stdout, again.stdout
    diff = kubectl("diff", "--server-side", "--field-manager", "argocd-controller", "-n",
                   namespace, "-f", str(manifest), check=False)  # fmt: skip
    assert diff.returncode == 0, f"the live object differs from the manifest:\n{diff.stdout}"
    assert isvc.get(custom, namespace, NAME)["spec"]["replicas"] == 3, "the autoscaler's write"
