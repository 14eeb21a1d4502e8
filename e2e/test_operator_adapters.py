"""spec.adapters on the real control plane, served by the pod's own command: an
InferenceService with two LoRA adapters -> the pod process (reading the operator's
ConfigMap at start) serves both; a third added to the spec is loaded into the running
pod by the operator, through its API, without a restart; one removed is unloaded; a bad
one is reported by name in AdaptersReady while the others keep serving.

kwok plays the kubelet, so the pod's IP is fake: the test gives the pod a loopback
address of its own (status.podIP patched, the server listening there on the container's
port), which is what the operator reads and calls, as it would a real pod IP. (The
EndpointSlice controller refuses loopback addresses; this test does not use the Service.)
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from transformers import AutoTokenizer

from e2e import isvc
from e2e.helpers import wait_for
from e2e.operator_process import OperatorProcess
from e2e.pod_process import PodProcess, dockerfile_env
from octavo.cache_dirs import cache_root
from octavo.model_executor.embedded import prepare_embedded_model
from tests.lora_adapters import make_adapter
from tests.tiny_models import build_tiny_model

NAME = "lora"


@pytest.fixture
def tiny_model() -> Iterator[tuple[Path, dict[str, Path]]]:
    """A tiny random Llama and three adapters of it, made with peft, outside /tmp (the
    pod's /tmp is a volume of its own, so file:// paths there would not be the same)."""
    root = Path(tempfile.mkdtemp(prefix="e2e-adapters-", dir=cache_root()))
    tokenizer = AutoTokenizer.from_pretrained(prepare_embedded_model(cache_root() / "models"))
    model = build_tiny_model(root / "tiny", "llama3", tokenizer)
    adapters = {name: make_adapter(model, root / name, seed=seed, rank=4)
                for seed, name in enumerate(("a", "b", "c"))}  # fmt: skip
    yield model, adapters
    shutil.rmtree(root, ignore_errors=True)


def adapter_list(adapters: dict[str, Path], names: str, bad: bool = False) -> list[dict]:
    listed = [{"name": name, "uri": f"file://{adapters[name]}"} for name in names]
    return listed + ([{"name": "bad", "uri": "file:///nowhere/adapter"}] if bad else [])


def served(pod: PodProcess) -> set[str]:
    with urllib.request.urlopen(pod.base_url("http") + "/v1/models", timeout=5) as reply:
        return {card["id"] for card in json.load(reply)["data"] if card.get("parent")}


def generate(pod: PodProcess, model: str) -> str:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 3}).encode()
    request = urllib.request.Request(pod.base_url("http") + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)["model"]


def pod_on_loopback(
    core: client.CoreV1Api, api_client, namespace: str, workdir: Path
) -> PodProcess:
    """The service's pod, its status.podIP moved to a loopback address its process binds."""
    selector = f"app.kubernetes.io/instance={NAME}"
    wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=selector).items,
             timeout=30, what="the service's pod")  # fmt: skip
    (pod,) = core.list_namespaced_pod(namespace, label_selector=selector).items
    ip = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}.{random.randint(2, 250)}"
    moved = [{"op": "add", "path": "/status/podIP", "value": ip},
             {"op": "add", "path": "/status/podIPs", "value": [{"ip": ip}]}]  # fmt: skip
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, moved)  # a JSON patch
    config_map = core.read_namespaced_config_map(f"{NAME}-adapters", namespace)
    maps = {(config_map.metadata.name, key): value for key, value in config_map.data.items()}
    fresh = api_client.sanitize_for_serialization(
        core.read_namespaced_pod(pod.metadata.name, namespace)
    )
    assert fresh["status"]["podIP"] == ip, "kwok put its own pod IP back"
    return PodProcess(fresh, workdir, config_maps=maps, pod_ip=ip)


def test_adapters_are_loaded_and_unloaded_in_a_running_pod(
    cluster, operator, no_other_operator, namespace, api_client, core, apps, custom,
    tiny_model, tmp_path,
):  # fmt: skip
    model, adapters = tiny_model
    own = OperatorProcess(cluster, tmp_path / "operator", OCTAVO_OPERATOR_ADAPTER_SYNC_SECONDS="1")
    own.start()
    spec = {"model": {"uri": f"file://{model}", "servedName": "tiny"}, "resources": {"gpu": 0},
            "engine": {"maxModelLen": 128, "maxLoras": 2, "maxLoraRank": 8,
                       "extraArgs": ["--kv-cache-memory", "64MiB"]},
            "adapters": adapter_list(adapters, "ab")}  # fmt: skip
    pod: PodProcess | None = None
    try:
        isvc.create(custom, namespace, isvc.manifest(NAME, spec))
        pod = pod_on_loopback(core, api_client, namespace, tmp_path / "pod")
        pod.start(dockerfile_env("server"))
        pod.wait_probe("startupProbe", limit=300)
        assert served(pod) == {"a", "b"}, "loaded from the ConfigMap before /health passed"
        assert generate(pod, "a") == "a"
        isvc.wait_condition(custom, namespace, NAME, "AdaptersReady", "True", timeout=60)
        pid, generation = (
            pod.proc.pid,
            apps.read_namespaced_deployment(NAME, namespace).metadata.generation,
        )
        change_adapters(custom, namespace, adapter_list(adapters, "abc"))
        wait_for(lambda: served(pod) == {"a", "b", "c"}, timeout=30, what="c loaded")
        assert generate(pod, "c") == "c"
        change_adapters(custom, namespace, adapter_list(adapters, "bc"))
        wait_for(lambda: served(pod) == {"b", "c"}, timeout=30, what="a unloaded")
        assert pod.proc.poll() is None and pod.proc.pid == pid, "the server was not restarted"
        dep = apps.read_namespaced_deployment(NAME, namespace)
        assert dep.metadata.generation == generation, "the pod template did not change"
        change_adapters(custom, namespace, adapter_list(adapters, "bc", bad=True))
        failed = isvc.wait_condition(custom, namespace, NAME, "AdaptersReady", "False",
                                     reason="LoadFailed", timeout=30)  # fmt: skip
        message = isvc.condition(failed, "AdaptersReady")["message"]
        assert "bad: 0/1 pods" in message and "no such folder" in message, message
        assert served(pod) == {"b", "c"} and generate(pod, "b") == "b"
    finally:
        if pod is not None:
            pod.stop()
        own.stop()
        assert "Traceback" not in own.tail(400), own.tail(80)


def change_adapters(custom: client.CustomObjectsApi, namespace: str, listed: list[dict]) -> None:
    isvc.patch(custom, namespace, NAME, {"spec": {"adapters": listed}})
