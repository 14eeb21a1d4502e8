"""spec.router on the real control plane: the InferencePool and the llm-d router's endpoint
picker the operator creates, routing three real `octavo serve` pods.

The operator runs as for every e2e test. The service's three pods (kwok's) are moved to
loopback addresses and their containers' commands run as processes; the picker pod's
containers too: the EPP binary built from the Go module proxy (e2e/cluster) with the
Deployment's args under the picker's own ServiceAccount, and its tokenizer sidecar. The
test plays the gateway: an ext_proc client (octavo_bench.gateway, Envoy's protocol, GIE
proposal 004) asks the picker for each request and reads `x-gateway-destination-endpoint`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from kubernetes import client

from e2e import isvc
from e2e.helpers import wait_for
from e2e.loopback_pod import is_ready, move_to_loopback, tiny_llama
from e2e.picker_pod import PickerPod
from e2e.pod_process import PodProcess, dockerfile_env
from e2e.router_setup import POOL_API, first_pick, install_pool_crd, pool_named, start_picker
from octavo.cache_dirs import cache_root
from octavo_bench.gateway.picker_client import Pick, PickerStream
from tests.lora_adapters import make_adapter

NAME = "routed"
PICKER = f"{NAME}-epp"
SHARED = " ".join(
    f"clause {i} of the shared handbook says the order ships in {i} days." for i in range(12)
)


@dataclass
class Routed:
    namespace: str
    pods: list[PodProcess]
    picker: PickerPod

    def address(self, pod: PodProcess) -> str:
        return f"{pod.pod_ip}:8000"


def service_spec(model: Path, adapter: Path) -> dict:
    engine = {
        "maxModelLen": 2048,
        "maxLoras": 2,
        "maxLoraRank": 8,
        "dtype": "float32",
        "maxNumSeqs": 2,
        "extraArgs": ["--kv-cache-memory", "64MiB", "--lora-allowed-roots", str(model.parent)],
    }
    return {
        "model": {"uri": f"file://{model}", "servedName": "tiny"},
        "replicas": 3,
        "resources": {"gpu": 0},
        "engine": engine,
        "adapters": [{"name": "a", "uri": f"file://{adapter}"}],
        "router": {"enabled": True, "picker": {"secureServing": False}},
        # The queue and adapter tests leave long requests running: at the end each pod
        # drains them for --shutdown-timeout (grace period - preStop - 5 s) = 2 s, not 45 s.
        "drain": {"preStopSeconds": 0, "terminationGracePeriodSeconds": 7},
    }


def server_pods(core: client.CoreV1Api, namespace: str, selector: dict[str, str]) -> list:
    text = ",".join(f"{k}={v}" for k, v in selector.items())
    pods = core.list_namespaced_pod(namespace, label_selector=text).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def start_servers(core, api_client, namespace: str, selector: dict, workdir: Path) -> list:
    def three_ready() -> list:
        pods = server_pods(core, namespace, selector)
        return pods if len(pods) == 3 and all(is_ready(p) for p in pods) else []

    kwok_pods = wait_for(three_ready, timeout=90, what="three server pods, Ready by kwok")
    processes = [
        move_to_loopback(core, api_client, namespace, pod, workdir / f"pod-{i}")
        for i, pod in enumerate(kwok_pods)
    ]
    for process in processes:
        process.start(dockerfile_env("server"))
    for process in processes:
        process.wait_probe("startupProbe", limit=300)
    return processes


@pytest.fixture(scope="module")
def routed(cluster, operator, api_client, apiext, core, apps, custom) -> Iterator[Routed]:
    root = Path(tempfile.mkdtemp(prefix="e2e-router-", dir=cache_root()))
    namespace = f"e2e-router-{int(time.time()) % 100000}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"octavo.dev/e2e": "true"}}})
    install_pool_crd(apiext)
    processes: list[PodProcess] = []
    picker: PickerPod | None = None
    try:
        model = tiny_llama(root)
        adapter = make_adapter(model, root / "a", seed=0, rank=4)
        wait_for(
            lambda: core.list_namespaced_service_account(namespace).items,
            timeout=30,
            what="the default ServiceAccount",
        )
        isvc.create(custom, namespace, isvc.manifest(NAME, service_spec(model, adapter)))
        found = wait_for(
            lambda: pool_named(custom, namespace, NAME), timeout=60, what="the InferencePool"
        )
        selector = found["spec"]["selector"]["matchLabels"]
        processes = start_servers(core, api_client, namespace, selector, root)
        picker = start_picker(cluster, apps, core, namespace, PICKER, root / "picker")
        yield Routed(namespace, processes, picker)
    finally:
        if picker is not None:
            picker.stop()
        with ThreadPoolExecutor(len(processes) or 1) as pool:  # the pods drain side by side
            list(pool.map(PodProcess.stop, processes))
        core.delete_namespace(namespace, propagation_policy="Background")
        shutil.rmtree(root, ignore_errors=True)


def post(url: str, body: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.load(reply)


async def ask(address: str, body: dict) -> Pick:
    """One request through the picker, as the gateway sends it; the answer is read from the
    chosen pod and reported back on the same stream."""
    async with grpc.aio.insecure_channel(address) as channel:
        stream, pick = await first_pick(channel, "/v1/completions", json.dumps(body).encode())
        assert pick.endpoint, f"the picker refused: {pick.status}"
        answer = await _forward(pick.endpoint, pick.body or json.dumps(body).encode())
        await stream.finish(200, answer, "application/json")
        return pick


async def _forward(endpoint: str, body: bytes) -> bytes:
    async with httpx.AsyncClient(timeout=120) as http:
        reply = await http.post(
            f"http://{endpoint}/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert reply.status_code == 200, reply.text
        return reply.content


def picked(routed: Routed, body: dict) -> str:
    return asyncio.run(ask(routed.picker.ext_proc_address, body)).endpoint


def completion(prompt: str, model: str = "tiny", max_tokens: int = 2) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def metric(pod: PodProcess, name: str) -> float:
    with urllib.request.urlopen(pod.base_url("http") + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def in_background(pod: PodProcess, body: dict, count: int) -> list[threading.Thread]:
    url = pod.base_url("http") + "/v1/completions"
    threads = [
        threading.Thread(target=post, args=(url, body, 600), daemon=True) for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads


def pick_only(routed: Routed, body: dict) -> str | None:
    """The picker's choice, without sending the request anywhere (the stream is cancelled)."""

    async def once() -> str | None:
        async with grpc.aio.insecure_channel(routed.picker.ext_proc_address) as channel:
            stream = PickerStream(channel)
            pick = await stream.pick("/v1/completions", json.dumps(body).encode(), {})
            await stream.close()
            return pick.endpoint

    return asyncio.run(once())


OWNED = (
    ("InferencePool", NAME),
    ("Deployment", PICKER),
    ("Service", PICKER),
    ("ConfigMap", PICKER),
    ("ServiceAccount", PICKER),
    ("Role", PICKER),
    ("RoleBinding", PICKER),
)


def read_child(api_client: client.ApiClient, namespace: str, kind: str, name: str):
    """The child as a dict, or None once it is gone."""
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    rbac, custom = client.RbacAuthorizationV1Api(api_client), client.CustomObjectsApi(api_client)
    readers = {
        "InferencePool": lambda: custom.get_namespaced_custom_object(
            *POOL_API[:2], namespace, POOL_API[2], name
        ),
        "Deployment": lambda: apps.read_namespaced_deployment(name, namespace),
        "Service": lambda: core.read_namespaced_service(name, namespace),
        "ConfigMap": lambda: core.read_namespaced_config_map(name, namespace),
        "ServiceAccount": lambda: core.read_namespaced_service_account(name, namespace),
        "Role": lambda: rbac.read_namespaced_role(name, namespace),
        "RoleBinding": lambda: rbac.read_namespaced_role_binding(name, namespace),
    }
    try:
        return api_client.sanitize_for_serialization(readers[kind]())
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_the_operator_creates_the_pool_and_the_picker(routed, api_client, custom):
    owner = isvc.get(custom, routed.namespace, NAME)["metadata"]["uid"]
    for kind, name in OWNED:
        child = read_child(api_client, routed.namespace, kind, name)
        assert child is not None, f"{kind} {name} missing"
        owners = [ref["uid"] for ref in child["metadata"].get("ownerReferences") or []]
        assert owner in owners, f"{kind} {name} is not owned by the InferenceService"
    spec = pool_named(custom, routed.namespace, NAME)["spec"]
    assert spec["targetPorts"] == [{"number": 8000}]
    assert spec["endpointPickerRef"]["name"] == PICKER
    assert spec["endpointPickerRef"]["port"] == {"number": 9002}
    pod_labels = routed.pods[0].pod["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    picker_labels = read_child(api_client, routed.namespace, "Deployment", PICKER)["spec"][
        "template"
    ]["metadata"]["labels"]
    assert not spec["selector"]["matchLabels"].items() <= picker_labels.items(), (
        "the pool must not select the picker's own pod"
    )


def test_requests_sharing_a_prefix_go_to_the_pod_holding_its_blocks(routed):
    """The holder got the prefix directly, not through the picker: only its KV events tell
    the picker where the blocks are."""
    holder = routed.pods[1]
    post(holder.base_url("http") + "/v1/completions", completion(SHARED + " Question zero?"))
    hits_before = metric(holder, "vllm:prefix_cache_hits_total")
    time.sleep(3)  # the events of that step reach the picker's index
    for question in ("When?", "Where to?", "How much?", "Who signs?", "Which box?"):
        assert picked(routed, completion(f"{SHARED} {question}")) == routed.address(holder)
    assert metric(holder, "vllm:prefix_cache_hits_total") > hits_before


def test_a_pod_with_a_long_queue_is_avoided(routed):
    busy = routed.pods[0]
    in_background(busy, completion("busy work " * 30, max_tokens=600), 6)
    wait_for(
        lambda: metric(busy, "vllm:num_requests_waiting") >= 3,
        timeout=60,
        what="a queue on the busy pod",
    )
    time.sleep(1)  # the picker scrapes every 50 ms
    for index in range(6):
        prompt = f"Request {index}: " + " ".join(f"word{index}x{j}" for j in range(20))
        assert pick_only(routed, completion(prompt)) != routed.address(busy)


def test_an_adapter_request_goes_to_the_pod_running_the_adapter(routed):
    holder = routed.pods[2]
    in_background(holder, completion("adapter work " * 10, model="a", max_tokens=600), 1)
    wait_for(
        lambda: metric(holder, "vllm:num_requests_running") >= 1,
        timeout=60,
        what="the adapter's request running",
    )
    time.sleep(1)
    for index in range(3):
        prompt = f"Adapter question {index}: " + " ".join(f"term{index}y{j}" for j in range(20))
        assert picked(routed, completion(prompt, model="a")) == routed.address(holder)


def test_a_deleted_pod_leaves_the_pool(routed, core):
    gone = routed.pods[1]
    core.delete_namespaced_pod(
        gone.pod["metadata"]["name"], routed.namespace, grace_period_seconds=0
    )
    gone.stop()
    time.sleep(2)  # the picker's pod watch
    for index in range(8):
        prompt = f"{SHARED} After deletion {index}?"
        assert pick_only(routed, completion(prompt)) != routed.address(gone)


def test_children_drift_back_and_go_with_the_service(routed, api_client, custom, core):
    namespace = routed.namespace
    custom.patch_namespaced_custom_object(
        *POOL_API[:2], namespace, POOL_API[2], NAME, {"spec": {"targetPorts": [{"number": 9000}]}}
    )
    wait_for(  # the operator's queue may be busy with another test's churn: up to 120 s
        lambda: pool_named(custom, namespace, NAME)["spec"]["targetPorts"] == [{"number": 8000}],
        timeout=120,
        what="the pool's targetPorts put back",
    )
    core.delete_namespaced_config_map(PICKER, namespace)
    wait_for(
        lambda: read_child(api_client, namespace, "ConfigMap", PICKER),
        timeout=60,
        what="the picker's ConfigMap recreated",
    )
    custom.delete_namespaced_custom_object(isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, NAME)
    for kind, name in OWNED:
        wait_for(
            lambda k=kind, n=name: read_child(api_client, namespace, k, n) is None,
            timeout=120,
            what=f"{kind} {name} deleted with the service",
        )
