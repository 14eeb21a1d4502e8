"""spec.adapters on the real control plane, served by the pod's own command: an
InferenceService with two LoRA adapters -> the pod process (reading the operator's
ConfigMap at start) serves both; a third added to the spec is loaded into the running
pod by the operator, through its API, without a restart; one removed is unloaded; a bad
one is reported by name in AdaptersReady while the others keep serving.

The pod runs on a loopback address standing in for its IP (e2e/loopback_pod.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from e2e import isvc
from e2e.helpers import wait_for
from e2e.loopback_pod import pod_on_loopback, tiny_llama
from e2e.operator_process import OperatorProcess
from e2e.pod_process import PodProcess, dockerfile_env
from octavo.cache_dirs import cache_root
from tests.lora_adapters import make_adapter

NAME = "lora"


@pytest.fixture
def tiny_model() -> Iterator[tuple[Path, dict[str, Path]]]:
    """A tiny random Llama and three adapters of it, made with peft, outside /tmp (the
    pod's /tmp is a volume of its own, so file:// paths there would not be the same)."""
    root = Path(tempfile.mkdtemp(prefix="e2e-adapters-", dir=cache_root()))
    model = tiny_llama(root)
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
        pod = pod_on_loopback(core, api_client, namespace, NAME, tmp_path / "pod")
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
