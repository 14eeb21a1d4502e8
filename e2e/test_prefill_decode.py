"""spec.prefill on the real control plane: the operator's prefill and decode Deployments, the
endpoint picker disaggregating, and the llm-d routing sidecar moving a long prompt's KV
from the prefill server to the decode server.

The operator runs as for every e2e test. The service's two pods (kwok's) are moved to
loopback addresses and run as processes: the prefill pod's `octavo serve`, the decode
pod's `octavo serve` and its routing sidecar (the `pd-sidecar` binary, e2e/pd_pods.py);
the picker pod's containers too (picker_pod.py). The test plays the gateway as
test_router.py does: it asks the picker over ext_proc, which names the decode pod and sets
`x-prefiller-host-port`, and sends the request there with that header; the sidecar has the
prefill pod compute the prompt, and the decode engine pulls its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from e2e import isvc
from e2e.helpers import wait_for
from e2e.loopback_pod import tiny_llama
from e2e.pd_pods import RoutingSidecar, role_pod
from e2e.picker_pod import PickerPod
from e2e.pod_process import PodProcess, dockerfile_env
from e2e.router_setup import first_pick, install_pool_crd, pool_named, start_picker
from octavo.cache_dirs import cache_root
from octavo_bench.gateway.picker_client import Pick

NAME = "split"
PICKER = f"{NAME}-epp"
PREFILL_HEADER = "x-prefiller-host-port"
LONG_PROMPT = " ".join(
    f"Item {i} of the packing list is a box of {i * 7} bolts." for i in range(40)
)
BY_SOURCE = "vllm:prompt_tokens_by_source"  # vLLM's counter, label source
CHAT_PATH = "/v1/chat/completions"


@dataclass
class Split:
    namespace: str
    prefill: PodProcess
    decode: PodProcess
    sidecar: RoutingSidecar
    picker: PickerPod


def service_spec(model: Path) -> dict:
    engine = {
        "maxModelLen": 2048,
        "dtype": "float32",
        "maxNumSeqs": 2,
        "extraArgs": ["--kv-cache-memory", "64MiB"],
    }
    return {
        "model": {"uri": f"file://{model}", "servedName": "tiny"},
        "replicas": 1,
        "resources": {"gpu": 0},
        "engine": engine,
        "router": {"enabled": True, "picker": {"secureServing": False}},
        "prefill": {"replicas": 1},
        "drain": {"preStopSeconds": 0, "terminationGracePeriodSeconds": 7},
    }


@pytest.fixture(scope="module")
def split(cluster, operator, api_client, apiext, core, apps, custom) -> Iterator[Split]:
    root = Path(tempfile.mkdtemp(prefix="e2e-pd-", dir=cache_root()))
    namespace = f"e2e-pd-{int(time.time()) % 100000}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"octavo.dev/e2e": "true"}}})
    install_pool_crd(apiext)
    started: list = []
    try:
        model = tiny_llama(root)
        wait_for(
            lambda: core.list_namespaced_service_account(namespace).items,
            timeout=30,
            what="the default ServiceAccount",
        )
        isvc.create(custom, namespace, isvc.manifest(NAME, service_spec(model)))
        wait_for(lambda: pool_named(custom, namespace, NAME), timeout=60, what="the pool")
        prefill = role_pod(core, api_client, namespace, NAME, "prefill", root / "prefill")
        decode = role_pod(core, api_client, namespace, NAME, "decode", root / "decode")
        sidecar = RoutingSidecar(cluster, decode.pod, root / "sidecar")
        for server in (prefill, decode):
            server.start(dockerfile_env("server"))
            started.append(server)
        sidecar.start()
        started.append(sidecar)
        for server in (prefill, decode):
            server.wait_probe("startupProbe", limit=300)
        picker = start_picker(cluster, apps, core, namespace, PICKER, root / "picker")
        started.append(picker)
        yield Split(namespace, prefill, decode, sidecar, picker)
    finally:
        with ThreadPoolExecutor(len(started) or 1) as pool:
            list(pool.map(stop, started))
        core.delete_namespace(namespace, propagation_policy="Background")
        shutil.rmtree(root, ignore_errors=True)


def stop(process: PodProcess | RoutingSidecar | PickerPod) -> None:
    """Stop one pod's processes. The picker's EPP keeps nothing worth a graceful stop and
    takes 30 s on SIGTERM (its manager's graceful-shutdown timeout): it is killed first."""
    if isinstance(process, PickerPod):
        for proc in process.procs:
            if "epp" in Path(proc.args[0]).name:
                proc.kill()
    process.stop()


def metric(pod: PodProcess, port: str, name: str, **labels: str) -> float:
    """The sum of NAME's samples (NAME or NAME_total) carrying LABELS."""
    with urllib.request.urlopen(pod.base_url(port) + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    total = 0.0
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        sample, _, rest = key.partition("{")
        if sample in (name, f"{name}_total") and all(w in rest for w in wanted):
            total += float(value)
    return total


def chat(prompt: str, **extra) -> dict:
    """A chat request: the sidecar sets max_completion_tokens on its prefill request, which
    only the chat endpoint takes (Octavo's /v1/completions refuses it, vLLM's ignores it)."""
    messages = [{"role": "user", "content": prompt}]
    return {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


async def through_gateway(split: Split, body: dict) -> tuple[Pick, dict]:
    """What the gateway does: ask the picker, send the request with its headers to the pod
    it named, report the answer on the same stream."""
    payload = json.dumps(body).encode()
    async with grpc.aio.insecure_channel(split.picker.ext_proc_address) as channel:
        stream, pick = await first_pick(channel, CHAT_PATH, payload)
        assert pick.endpoint, f"the picker refused: {pick.status}"
        # The picker's header mutations (Envoy applies them), less HTTP/2 pseudo-headers.
        mutations = {k: v for k, v in pick.headers.items() if not k.startswith(":")}
        headers = {**mutations, "content-type": "application/json"}
        async with httpx.AsyncClient(timeout=120) as http:
            reply = await http.post(
                f"http://{pick.endpoint}{CHAT_PATH}",
                content=pick.body or payload,
                headers=headers,
            )
        assert reply.status_code == 200, f"{reply.text}\n{split.sidecar.log_tail()}"
        await stream.finish(200, reply.content, "application/json")
        return pick, reply.json()


def test_the_operator_writes_both_pools_with_their_roles(split, apps, custom):
    decode = apps.read_namespaced_deployment(NAME, split.namespace).spec.template
    prefill = apps.read_namespaced_deployment(f"{NAME}-prefill", split.namespace).spec.template
    assert decode.metadata.labels["llm-d.ai/role"] == "decode"
    assert prefill.metadata.labels["llm-d.ai/role"] == "prefill"
    assert decode.spec.init_containers[0].name == "routing-sidecar"
    assert not prefill.spec.init_containers
    wait_for(
        lambda: (
            (isvc.get(custom, split.namespace, NAME).get("status") or {}).get("prefill", {})
            == {"deployment": f"{NAME}-prefill", "replicas": 1, "readyReplicas": 1}
        ),
        timeout=60,
        what="status.prefill with its ready replica",
    )


def test_a_long_prompt_is_prefilled_once_and_decoded_from_its_pulled_blocks(split):
    prefilled_before = metric(split.prefill, "http", "vllm:prompt_tokens")
    computed_before = metric(split.decode, "engine", BY_SOURCE, source="local_compute")
    pulled_before = metric(split.decode, "engine", BY_SOURCE, source="external_kv_transfer")
    pick, answer = asyncio.run(through_gateway(split, chat(LONG_PROMPT)))
    assert pick.endpoint == f"{split.decode.pod_ip}:8000"
    assert pick.headers.get(PREFILL_HEADER) == f"{split.prefill.pod_ip}:8000"
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert prompt_tokens > 300
    prefilled = metric(split.prefill, "http", "vllm:prompt_tokens") - prefilled_before
    assert prefilled == prompt_tokens
    computed = metric(split.decode, "engine", BY_SOURCE, source="local_compute") - computed_before
    assert computed <= 1, f"the decode server computed {computed} prompt tokens itself"
    pulled = metric(split.decode, "engine", BY_SOURCE, source="external_kv_transfer")
    assert pulled - pulled_before >= prompt_tokens - 1
    # The prefill server alone, its prefix cache kept out by a salt: one server's answer.
    url = split.prefill.base_url("http") + CHAT_PATH
    alone = httpx.post(url, json=chat(LONG_PROMPT, cache_salt="alone"), timeout=120).json()
    assert answer["choices"][0]["message"] == alone["choices"][0]["message"]
