"""Scale from zero through the InferencePool, on the real control plane.

A routed service (spec.router) with autoscaling.minReplicas 0 goes idle and the operator
sets it to 0 replicas. A request then goes where a gateway sends it: to the endpoint
picker (ext_proc), whose flow control holds it while the pool has no pod. The operator
reads the picker's held-request count, sets the service back to 1 replica; the new pod
(its command run as a process on a loopback IP) joins the pool and the picker releases the
request to it, which answers. The picker pod is moved to a loopback IP too, with its
metrics port forwarded there, since the operator scrapes `<picker pod IP>:9090`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from e2e import isvc
from e2e.helpers import wait_for
from e2e.loopback_pod import is_ready, move_to_loopback, temporary_tiny_llama
from e2e.operator_process import OperatorProcess
from e2e.pod_process import PodProcess, dockerfile_env
from e2e.router_setup import install_pool_crd, start_picker
from octavo_bench.gateway.picker_client import Pick, PickerError, PickerStream

NAME = "coldpool"
PICKER = f"{NAME}-epp"
IDLE_SECONDS = 10
DEFAULT_IDLE = {"scaleToZeroAfterSeconds": 300}


@pytest.fixture
def tiny_model():
    with temporary_tiny_llama("e2e-router-zero-") as model:
        yield model


def spec_of(model: Path) -> dict:
    return {
        "model": {"uri": f"file://{model}", "servedName": "tiny"},
        "resources": {"gpu": 0},
        "engine": {"maxModelLen": 128, "extraArgs": ["--kv-cache-memory", "64MiB"]},
        "autoscaling": {
            "minReplicas": 0,
            "maxReplicas": 1,
            "scaleToZeroAfterSeconds": IDLE_SECONDS,
        },
        "router": {"enabled": True, "picker": {"secureServing": False}},
    }


def kwok_pods(core, namespace: str, component: str) -> list:
    selector = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name={component}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if not p.metadata.deletion_timestamp and is_ready(p)]


def launch_server(core, api_client, namespace: str, workdir: Path, skip=()) -> PodProcess:
    """The server pod's command started on its loopback IP (its model still loading)."""

    def fresh() -> list:
        return [
            p for p in kwok_pods(core, namespace, "octavo-server") if p.metadata.name not in skip
        ]

    (pod,) = wait_for(fresh, timeout=90, what="a server pod, Ready by kwok")
    process = move_to_loopback(core, api_client, namespace, pod, workdir)
    process.start(dockerfile_env("server"))
    return process


def start_server(core, api_client, namespace: str, workdir: Path, skip=()) -> PodProcess:
    process = launch_server(core, api_client, namespace, workdir, skip)
    process.wait_probe("startupProbe", limit=300)
    return process


async def routed_completion(address: str, out: dict) -> None:
    """A request as a gateway sends it: ask the picker (which may hold it), then call the pod
    it names. kwok marks a new pod Ready at once, before its process has loaded the model (a
    kubelet would keep it NotReady until its probe passes), so the picker may name a pod
    that still answers 503 "loading" or still carries kwok's made-up IP; the gateway then
    retries through the picker, as Envoy's retry policy would."""
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 3}).encode()
    started, deadline = time.monotonic(), time.monotonic() + 240
    async with grpc.aio.insecure_channel(address) as channel:
        while True:
            stream = PickerStream(channel)
            try:
                pick = await stream.pick("/v1/completions", body, {})
            except (PickerError, grpc.aio.AioRpcError) as error:
                pick = Pick([], status=599, headers={"error": str(error)[:200]})
            out.setdefault("picked_after", time.monotonic() - started)
            if pick.endpoint is None:
                refusal = {"error": f"the picker refused: {pick.headers}"}
                status, content = pick.status or 503, json.dumps(refusal).encode()
            else:
                status, content = await forward(pick.endpoint, pick.body or body)
                await stream.finish(status, content, "application/json")
            out["last"] = (pick.endpoint, status, content[:200])
            if status == 200 or time.monotonic() > deadline:
                break
            out["retries"] = out.get("retries", 0) + 1
            await asyncio.sleep(0.5)
    out.update(status=status, body=json.loads(content), seconds=time.monotonic() - started)


async def forward(endpoint: str, body: bytes) -> tuple[int, bytes]:
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            reply = await http.post(
                f"http://{endpoint}/v1/completions",
                content=body,
                headers={"content-type": "application/json"},
            )
    except httpx.HTTPError as error:
        return 502, json.dumps({"error": {"message": str(error)}}).encode()
    return reply.status_code, reply.content


def test_a_request_to_the_pool_at_zero_is_held_and_wakes_the_service(
    cluster,
    operator,
    no_other_operator,
    namespace,
    api_client,
    apiext,
    core,
    apps,
    custom,
    tiny_model,
    tmp_path,
):
    install_pool_crd(apiext)
    own = OperatorProcess(
        cluster,
        tmp_path / "operator",
        OCTAVO_OPERATOR_IDLE_CHECK_SECONDS="1",
        OCTAVO_OPERATOR_PICKER_WAKE_SECONDS="1",
    )
    own.start()
    processes: list[PodProcess] = []
    picker = None
    try:
        isvc.create(custom, namespace, isvc.manifest(NAME, spec_of(tiny_model)))
        # The first pod's model loads while the picker pod starts.
        processes.append(launch_server(core, api_client, namespace, tmp_path / "pod-1"))
        first = processes[0].pod["metadata"]["name"]
        (picker_kwok,) = wait_for(
            lambda: kwok_pods(core, namespace, "octavo-router"),
            timeout=60,
            what="the picker pod, Ready by kwok",
        )
        moved = move_to_loopback(core, api_client, namespace, picker_kwok, tmp_path / "picker-pod")
        config = core.read_namespaced_config_map(PICKER, namespace).data
        assert "flowControl" in next(iter(config.values())), "scale to zero turns flow control on"
        picker = start_picker(
            cluster, apps, core, namespace, PICKER, tmp_path / "picker", pod_ip=moved.pod_ip
        )
        processes[0].wait_probe("startupProbe", limit=300)

        wait_for(
            lambda: isvc.get(custom, namespace, NAME)["spec"].get("replicas") == 0,
            timeout=IDLE_SECONDS + 60,
            what="the idle service set to 0 replicas",
        )
        processes.pop().stop()
        wait_for(
            lambda: not kwok_pods(core, namespace, "octavo-server"),
            timeout=60,
            what="the server pod gone",
        )
        # The new pod is Ready (kwok) while its model loads: with the default idle period
        # that load does not count as idle time and set the service to 0 again.
        isvc.patch(custom, namespace, NAME, {"spec": {"autoscaling": DEFAULT_IDLE}})

        answer: dict = {}
        caller = threading.Thread(
            target=lambda: asyncio.run(routed_completion(picker.ext_proc_address, answer))
        )
        started = time.monotonic()
        caller.start()
        wait_for(
            lambda: isvc.get(custom, namespace, NAME)["spec"].get("replicas") == 1,
            timeout=60,
            what="the held request waking the service",
        )
        woken = time.monotonic() - started
        processes.append(
            start_server(core, api_client, namespace, tmp_path / "pod-2", skip=(first,))
        )
        caller.join(timeout=180)
        assert answer.get("status") == 200, answer
        assert answer["body"]["choices"][0]["text"], answer
        reasons = {e.reason for e in core.list_namespaced_event(namespace).items}
        assert "ScaledFromZero" in reasons, reasons
        print(
            f"woken after {woken:.1f} s; first pick after {answer['picked_after']:.1f} s, "
            f"{answer.get('retries', 0)} retries; "
            f"answered after {answer['seconds']:.1f} s (the pod's own start included)"
        )
    finally:
        if picker is not None:
            picker.stop()
        for process in processes:
            process.stop()
        own.stop()
        assert "Traceback" not in own.tail(400), own.tail(80)
