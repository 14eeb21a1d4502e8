"""A service's pod served for real by its own command, reachable at its status.podIP.

kwok plays the kubelet, so a pod's IP is fake: `pod_on_loopback` gives the pod a loopback
address of its own (status.podIP patched; the server listens there on the container's
port), which is what the operator and its activator read and call, as they would a real
pod IP. The move waits until kwok has marked the pod Ready: kwok's later status patches
carry its own IP, which the apiserver then refuses, so the pod would never turn Ready.
(The EndpointSlice controller refuses loopback addresses: tests using this call the pod
or the activator directly, not the Service.) `tiny_llama` builds a small random model
outside /tmp (a pod's /tmp is a volume of its own, so file:// paths there would not be
the same).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kubernetes import client
from transformers import AutoTokenizer

from e2e.helpers import wait_for
from e2e.pod_process import PodProcess
from octavo.cache_dirs import cache_root
from octavo.model_executor.embedded import prepare_embedded_model
from tests.tiny_models import build_tiny_model


def tiny_llama(root: Path) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(prepare_embedded_model(cache_root() / "models"))
    return build_tiny_model(root / "tiny", "llama3", tokenizer)


@contextlib.contextmanager
def temporary_tiny_llama(prefix: str) -> Iterator[Path]:
    """A tiny Llama in a fresh folder under the cache (not /tmp: a pod's /tmp is a volume
    of its own, so file:// paths there would differ), removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=cache_root()))
    try:
        yield tiny_llama(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def pod_on_loopback(
    core: client.CoreV1Api,
    api_client: client.ApiClient,
    namespace: str,
    instance: str,
    workdir: Path,
    skip: frozenset[str] = frozenset(),
) -> PodProcess:
    """The service's pod (not one named in SKIP), its status.podIP moved to a loopback
    address its process binds; the ConfigMaps its env names are read from the apiserver."""
    selector = f"app.kubernetes.io/instance={instance}"

    def fresh_pods() -> list:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        return [
            p for p in pods if p.metadata.name not in skip and not p.metadata.deletion_timestamp
        ]

    def kwok_ready() -> list:  # kwok's own patches carry its IP: once moved, they fail
        pods = fresh_pods()
        return pods if pods and all(is_ready(p) for p in pods) else []

    (pod,) = wait_for(kwok_ready, timeout=60, what="the service's pod, Ready by kwok")
    return move_to_loopback(core, api_client, namespace, pod, workdir)


def move_to_loopback(
    core: client.CoreV1Api,
    api_client: client.ApiClient,
    namespace: str,
    pod: client.V1Pod,
    workdir: Path,
) -> PodProcess:
    """POD (Ready by kwok) with its status.podIP moved to a loopback address of its own."""
    ip = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}.{random.randint(2, 250)}"
    moved = [
        {"op": "add", "path": "/status/podIP", "value": ip},
        {"op": "add", "path": "/status/podIPs", "value": [{"ip": ip}]},
    ]
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, moved)  # a JSON patch
    fresh = api_client.sanitize_for_serialization(
        core.read_namespaced_pod(pod.metadata.name, namespace)
    )
    assert fresh["status"]["podIP"] == ip, "kwok put its own pod IP back"
    return PodProcess(fresh, workdir, config_maps=config_maps_of(core, namespace, fresh), pod_ip=ip)


def is_ready(pod: client.V1Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def config_maps_of(core: client.CoreV1Api, namespace: str, pod: dict) -> dict:
    """(map, key) -> value for every configMapKeyRef in the pod's first container."""
    env = pod["spec"]["containers"][0].get("env") or []
    refs = [
        var["valueFrom"]["configMapKeyRef"]
        for var in env
        if "configMapKeyRef" in (var.get("valueFrom") or {})
    ]
    out = {}
    for ref in refs:
        data = core.read_namespaced_config_map(ref["name"], namespace).data or {}
        out[(ref["name"], ref["key"])] = data[ref["key"]]
    return out
