"""What the spec.router e2e tests share: the InferencePool CRD (the chart's copy of GIE's),
reading a pool, and the operator's picker pod run as processes (picker_pod.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
from kubernetes import client

from e2e.cluster.paths import REPO_ROOT
from e2e.operator_process import install_crd
from e2e.picker_pod import PickerPod
from octavo_bench.gateway.picker_client import Pick, PickerStream

POOL_API = ("inference.networking.k8s.io", "v1", "inferencepools")
POOL_CRD = REPO_ROOT / "charts/octavo/files/crds/inference.networking.k8s.io_inferencepools.yaml"
# The picker's gRPC port opens before its pod informer has listed the pool's pods: until
# then it refuses with 503, as a gateway in front of a just-started picker would see.
PICKER_WARM_UP_SECONDS = 60.0


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


async def first_pick(
    channel: grpc.aio.Channel, path: str, body: bytes
) -> tuple[PickerStream, Pick]:
    """The picker's answer on a fresh stream, asked again while it refuses with 503 for up to
    ``PICKER_WARM_UP_SECONDS`` (a refusal picks nothing, so it leaves no routing state)."""
    deadline = time.monotonic() + PICKER_WARM_UP_SECONDS
    while True:
        stream = PickerStream(channel)
        pick = await stream.pick(path, body, {})
        if pick.endpoint or pick.status != 503 or time.monotonic() > deadline:
            return stream, pick
        await asyncio.sleep(0.5)
