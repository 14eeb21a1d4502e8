"""Scale to zero on the real control plane, served by the pod's own command: an
InferenceService with autoscaling.minReplicas 0 starts with one replica (and the default
idle period, 300 s); once its pod answers, scaleToZeroAfterSeconds is edited down to
IDLE_SECONDS; short requests (far shorter than the operator's 1 s check period, so never
seen running) keep it up for several idle periods; idle for
scaleToZeroAfterSeconds, the operator sets it to 0 through /scale (the Deployment follows,
Ready stays True with reason ScaledToZero, an Event says so) and points its Service at the
activator with an EndpointSlice. With the default period back (the new pod's load is
not idle time), a request sent to the activator with the service's
DNS name as Host then sets it back to 1, waits until the new pod answers and gets the
model's answer; the EndpointSlice goes once the pod is ready.

The pods run on loopback addresses standing in for their IPs (e2e/loopback_pod.py); the
activator's address in the EndpointSlice is a made-up pod IP (the EndpointSlice API
refuses loopback ones), and the request is sent to the activator's port directly, as
kube-proxy would forward it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from e2e import isvc
from e2e.helpers import wait_for
from e2e.loopback_pod import pod_on_loopback, temporary_tiny_llama
from e2e.operator_process import OperatorProcess
from e2e.pod_process import PodProcess, dockerfile_env
from e2e.ports import free_port

NAME = "idle"
ACTIVATOR_IP = "10.244.7.7"
# kwok marks a pod Ready at once, so the operator's idle clock runs while the pod's process
# still loads (a kubelet would keep it NotReady until its probe passes); on a loaded 2-core
# machine that load took more than 10 s (CI, 2026-11-26), which set a service created with a
# 10 s period to 0 before its first request. So the service starts with the default period
# (300 s) and gets IDLE_SECONDS once its pod has answered a request. With a request every
# 2 s and a check every 1 s, the longest stretch the checks see no request is under 3 s: a
# quarter of the idle period.
IDLE_SECONDS, DEFAULT_IDLE_SECONDS = 12, 300
REQUEST_EVERY, BUSY_SECONDS = 2.0, 2.5 * IDLE_SECONDS


@pytest.fixture
def tiny_model():
    with temporary_tiny_llama("e2e-scale-to-zero-") as model:
        yield model


def spec_of(model: Path) -> dict:
    return {
        "model": {"uri": f"file://{model}", "servedName": "tiny"},
        "resources": {"gpu": 0},
        "engine": {"maxModelLen": 128, "extraArgs": ["--kv-cache-memory", "64MiB"]},
        "autoscaling": {"minReplicas": 0, "maxReplicas": 1},
    }


def replicas(custom: client.CustomObjectsApi, namespace: str) -> int | None:
    return isvc.get(custom, namespace, NAME)["spec"].get("replicas")


def activator_slice(discovery: client.DiscoveryV1Api, namespace: str) -> dict | None:
    try:
        piece = discovery.read_namespaced_endpoint_slice(f"{NAME}-activator", namespace)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return client.ApiClient().sanitize_for_serialization(piece)


def complete(base_url: str, out: dict) -> None:
    """POST a completion to the activator as a client of the Service would send it."""
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 3}).encode()
    headers = {"Content-Type": "application/json", "Host": out["host"]}
    request = urllib.request.Request(base_url + "/v1/completions", body, headers)
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as reply:
        out.update(status=reply.status, body=json.load(reply), seconds=time.monotonic() - started)


def shorten_idle_period(pod: PodProcess, custom: client.CustomObjectsApi, namespace: str) -> None:
    """One request (the idle clock restarts when a check sees it), then IDLE_SECONDS."""
    out = {"host": f"{NAME}.{namespace}.svc.cluster.local:8000"}
    complete(pod.base_url("http"), out)
    assert out["status"] == 200, out
    autoscaling = isvc.get(custom, namespace, NAME)["spec"]["autoscaling"]
    assert autoscaling["scaleToZeroAfterSeconds"] == DEFAULT_IDLE_SECONDS
    set_idle_period(custom, namespace, IDLE_SECONDS)


def set_idle_period(custom: client.CustomObjectsApi, namespace: str, seconds: int) -> None:
    patch = {"spec": {"autoscaling": {"scaleToZeroAfterSeconds": seconds}}}
    isvc.patch(custom, namespace, NAME, patch)


def keep_busy(pod: PodProcess, custom: client.CustomObjectsApi, namespace: str) -> None:
    """A short request every REQUEST_EVERY seconds for BUSY_SECONDS: the service stays up."""
    started, durations = time.monotonic(), []
    while time.monotonic() - started < BUSY_SECONDS:
        took = time.monotonic()
        out = {"host": f"{NAME}.{namespace}.svc.cluster.local:8000"}
        complete(pod.base_url("http"), out)
        assert out["status"] == 200, out
        durations.append(out["seconds"])
        assert replicas(custom, namespace) == 1, (
            f"scaled to zero {time.monotonic() - started:.0f} s into a request every "
            f"{REQUEST_EVERY} s"
        )
        time.sleep(max(0.0, REQUEST_EVERY - (time.monotonic() - took)))
    print(f"{len(durations)} requests kept it up; the longest took {max(durations):.2f} s")


def start_pod(core, api_client, namespace: str, workdir: Path, skip=frozenset()) -> PodProcess:
    pod = pod_on_loopback(core, api_client, namespace, NAME, workdir, skip=skip)
    pod.start(dockerfile_env("server"))
    pod.wait_probe("startupProbe", limit=300)
    return pod


def test_idle_service_scales_to_zero_and_a_request_brings_it_back(
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
    port = free_port()
    own = OperatorProcess(
        cluster,
        tmp_path / "operator",
        OCTAVO_OPERATOR_IDLE_CHECK_SECONDS="1",
        args=(
            "--activator-port",
            str(port),
            "--activator-address",
            ACTIVATOR_IP,
            "--activation-timeout",
            "300",
        ),
    )
    own.start()
    discovery = client.DiscoveryV1Api(api_client)
    pods: list[PodProcess] = []
    try:
        isvc.create(custom, namespace, isvc.manifest(NAME, spec_of(tiny_model)))
        assert replicas(custom, namespace) == 1, "a new service starts with one replica"
        pods.append(start_pod(core, api_client, namespace, tmp_path / "pod-1"))
        first = pods[0].pod["metadata"]["name"]
        shorten_idle_period(pods[0], custom, namespace)
        keep_busy(pods[0], custom, namespace)

        wait_for(
            lambda: replicas(custom, namespace) == 0,
            timeout=IDLE_SECONDS + 60,
            what="the idle service set to 0 replicas",
        )
        wait_for(
            lambda: apps.read_namespaced_deployment(NAME, namespace).spec.replicas == 0,
            timeout=30,
            what="the Deployment at 0",
        )
        isvc.wait_condition(
            custom, namespace, NAME, "Ready", "True", reason="ScaledToZero", timeout=30
        )
        piece = wait_for(
            lambda: activator_slice(discovery, namespace),
            timeout=30,
            what="the activator's EndpointSlice",
        )
        assert piece["metadata"]["labels"]["kubernetes.io/service-name"] == NAME
        assert piece["endpoints"][0]["addresses"] == [ACTIVATOR_IP]
        assert piece["ports"] == [{"name": "http", "port": port, "protocol": "TCP"}]
        reasons = {e.reason for e in core.list_namespaced_event(namespace).items}
        assert "ScaledToZero" in reasons, reasons
        pods.pop().stop()
        # The new pod is Ready (kwok) while its model loads: back to the default period, so
        # that load does not count as idle time and set the service to 0 again.
        set_idle_period(custom, namespace, DEFAULT_IDLE_SECONDS)

        answer = {"host": f"{NAME}.{namespace}.svc.cluster.local:8000"}
        caller = threading.Thread(target=complete, args=(f"http://127.0.0.1:{port}", answer))
        caller.start()
        wait_for(
            lambda: replicas(custom, namespace) == 1,
            timeout=30,
            what="the activator to set replicas back to 1",
        )
        pods.append(
            start_pod(core, api_client, namespace, tmp_path / "pod-2", skip=frozenset({first}))
        )
        caller.join(timeout=120)
        assert answer.get("status") == 200, answer
        assert answer["body"]["model"] == "tiny" and answer["body"]["choices"][0]["text"]
        wait_for(
            lambda: activator_slice(discovery, namespace) is None,
            timeout=30,
            what="the activator's EndpointSlice removed once a pod is ready",
        )
        assert "Traceback" not in own.tail(400), own.tail(80)
        print(f"request held by the activator for {answer['seconds']:.1f} s")
    finally:
        for pod in pods:
            pod.stop()
        own.stop()
