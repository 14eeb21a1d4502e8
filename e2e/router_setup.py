"""What the spec.router e2e tests share: the InferencePool CRD (the chart's copy of GIE's),
reading a pool, and the operator's picker pod run as processes (picker_pod.py)."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from e2e.cluster.paths import REPO_ROOT
from e2e.operator_process import install_crd
from e2e.picker_pod import PickerPod

POOL_API = ("inference.networking.k8s.io", "v1", "inferencepools")
POOL_CRD = REPO_ROOT / "charts/octavo/files/crds/inference.networking.k8s.io_inferencepools.yaml"


def install_pool_crd(apiext: client.ApiextensionsV1Api) -> None:
    install_crd(apiext, POOL_CRD)


def pool_named(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict | None:
    try:
        return custom.get_namespaced_custom_object(*POOL_API[:2], namespace, POOL_API[2], name)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def start_picker(
    cluster, apps, core, namespace: str, name: str, workdir: Path, pod_ip: str | None = None
) -> PickerPod:
    deployment = apps.read_namespaced_deployment(name, namespace)
    config = core.read_namespaced_config_map(name, namespace).data
    picker = PickerPod(
        cluster,
        apps.api_client.sanitize_for_serialization(deployment),
        next(iter(config.values())),
        workdir,
        pod_ip=pod_ip,
    )
    picker.start()
    return picker
