"""spec.adapters on the real control plane, served by the pod's own command: an
InferenceService with two LoRA adapters -> the pod process (reading the operator's
ConfigMap at start) serves both; a third added to the spec (in a folder the spec allows
with --lora-allowed-roots) is loaded into the running pod by the operator, through its
API, without a restart; one removed is unloaded; a bad
one is reported by name in AdaptersReady while the others keep serving. Each adapter
changes the greedy output, and the pod's tokens for the base model and for each adapter
are those of HF transformers + PEFT for the same weights: the adapter really is applied,
not only named in the answer.

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
import torch
from kubernetes import client
from transformers import AutoTokenizer

from e2e import isvc
from e2e.helpers import wait_for
from e2e.loopback_pod import pod_on_loopback, tiny_llama
from e2e.operator_process import OperatorProcess
from e2e.pod_process import PodProcess, dockerfile_env
from octavo.cache_dirs import cache_root
from tests.lora_adapters import hf_with_adapter, make_adapter

NAME = "lora"
PROMPT = [(j * 11) % 900 + 5 for j in range(12)]  # token ids
NEW_TOKENS = 8
Expected = dict[str, list[str]]  # model name (the base "tiny" or an adapter) -> its tokens


@pytest.fixture
def tiny_model() -> Iterator[tuple[Path, dict[str, Path], Expected]]:
    """A tiny random Llama, three adapters of it made with peft (outside /tmp: the pod's
    /tmp is a volume of its own, so file:// paths there would not be the same), and the
    greedy tokens HF transformers + PEFT give for the base and for each adapter."""
    root = Path(tempfile.mkdtemp(prefix="e2e-adapters-", dir=cache_root()))
    model = tiny_llama(root)
    adapters = {
        name: make_adapter(model, root / name, seed=seed, rank=4)
        for seed, name in enumerate(("a", "b", "c"))
    }
    expected = {"tiny": reference_tokens(model, None)}
    expected.update({name: reference_tokens(model, path) for name, path in adapters.items()})
    assert len({tuple(tokens) for tokens in expected.values()}) == 4, (
        f"each adapter must change the greedy output: {expected}"
    )
    yield model, adapters, expected
    shutil.rmtree(root, ignore_errors=True)


def reference_tokens(model: Path, adapter: Path | None) -> list[str]:
    """Greedy tokens of PROMPT, from HF transformers (+ PEFT with ADAPTER), in fp32."""
    reference, ids = hf_with_adapter(model, adapter), list(PROMPT)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
    tokenizer = AutoTokenizer.from_pretrained(model)
    return [tokenizer.decode([token]) for token in ids[len(PROMPT) :]]


def adapter_list(adapters: dict[str, Path], names: str, bad: bool = False) -> list[dict]:
    listed = [{"name": name, "uri": f"file://{adapters[name]}"} for name in names]
    return listed + ([{"name": "bad", "uri": "file:///nowhere/adapter"}] if bad else [])


def served(pod: PodProcess) -> set[str]:
    with urllib.request.urlopen(pod.base_url("http") + "/v1/models", timeout=5) as reply:
        return {card["id"] for card in json.load(reply)["data"] if card.get("parent")}


def generate(pod: PodProcess, model: str) -> tuple[str, list[str]]:
    """The answering model's name and its greedy tokens for PROMPT."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    request = urllib.request.Request(
        pod.base_url("http") + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        answer = json.load(reply)
    return answer["model"], answer["choices"][0]["logprobs"]["tokens"]


def assert_serves(pod: PodProcess, expected: Expected, *models: str) -> None:
    for model in models:
        assert generate(pod, model) == (model, expected[model]), f"{model}: not HF + PEFT's"


def test_adapters_are_loaded_and_unloaded_in_a_running_pod(
    cluster,
    operator,
    no_other_operator,
    namespace,
    api_client,
    core,
    apps,
    custom,
    tiny_model,
    tmp_path,
):
    model, adapters, expected = tiny_model
    own = OperatorProcess(cluster, tmp_path / "operator", OCTAVO_OPERATOR_ADAPTER_SYNC_SECONDS="1")
    own.start()
    spec = {
        "model": {"uri": f"file://{model}", "servedName": "tiny"},
        "resources": {"gpu": 0},
        "engine": {
            "maxModelLen": 128,
            "maxLoras": 2,
            "maxLoraRank": 8,
            "dtype": "float32",
            "extraArgs": ["--kv-cache-memory", "64MiB", "--lora-allowed-roots", str(model.parent)],
        },
        "adapters": adapter_list(adapters, "ab"),
    }
    pod: PodProcess | None = None
    try:
        isvc.create(custom, namespace, isvc.manifest(NAME, spec))
        pod = pod_on_loopback(core, api_client, namespace, NAME, tmp_path / "pod")
        pod.start(dockerfile_env("server"))
        pod.wait_probe("startupProbe", limit=300)
        assert served(pod) == {"a", "b"}, "loaded from the ConfigMap before /health passed"
        assert_serves(pod, expected, "tiny", "a", "b")
        isvc.wait_condition(custom, namespace, NAME, "AdaptersReady", "True", timeout=60)
        pid, generation = (
            pod.proc.pid,
            apps.read_namespaced_deployment(NAME, namespace).metadata.generation,
        )
        change_adapters(custom, namespace, adapter_list(adapters, "abc"))
        wait_for(lambda: served(pod) == {"a", "b", "c"}, timeout=30, what="c loaded")
        assert_serves(pod, expected, "c", "a")
        change_adapters(custom, namespace, adapter_list(adapters, "bc"))
        wait_for(lambda: served(pod) == {"b", "c"}, timeout=30, what="a unloaded")
        assert pod.proc.poll() is None and pod.proc.pid == pid, "the server was not restarted"
        dep = apps.read_namespaced_deployment(NAME, namespace)
        assert dep.metadata.generation == generation, "the pod template did not change"
        change_adapters(custom, namespace, adapter_list(adapters, "bc", bad=True))
        failed = isvc.wait_condition(
            custom, namespace, NAME, "AdaptersReady", "False", reason="LoadFailed", timeout=30
        )
        message = isvc.condition(failed, "AdaptersReady")["message"]
        assert "bad: 0/1 pods" in message and "is not an adapter" in message, message
        assert served(pod) == {"b", "c"}
        assert_serves(pod, expected, "b", "tiny")
    finally:
        if pod is not None:
            pod.stop()
        own.stop()
        assert "Traceback" not in own.tail(400), own.tail(80)


def change_adapters(custom: client.CustomObjectsApi, namespace: str, listed: list[dict]) -> None:
    isvc.patch(custom, namespace, NAME, {"spec": {"adapters": listed}})
