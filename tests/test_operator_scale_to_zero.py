"""Scale to zero, the operator's parts without a cluster: the idle decision, a pod's load
read from a real /metrics text, the activator's EndpointSlice, the Host -> service lookup,
and what minReplicas 0 changes in the children and the status."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from octavo_operator.activator_target import Target, UnknownTarget, target_from_host
from octavo_operator.builders.activator_slice import ActivatorAddress, activator_slice
from octavo_operator.builders.autoscaler import horizontal_pod_autoscaler
from octavo_operator.builders.network_policy import OPERATOR_PODS, network_policy
from octavo_operator.idle_scaler import IdleClock, decide, pod_load
from octavo_operator.status import Observed, compute

from isvc_factories import isvc

TO_ZERO = {"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfterSeconds": 60}}
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="chat"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="chat"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="chat"}} 0.5
"""


def test_idle_time_counts_only_while_no_request_runs_or_waits() -> None:
    clock = IdleClock(last_busy=0.0, replicas=1)
    assert not decide(clock, 1, [0.0], now=30, after_seconds=60).scale_to_zero
    assert decide(clock, 1, [0.0, 0.0], now=60, after_seconds=60).scale_to_zero
    busy = decide(clock, 1, [0.0, 2.0], now=61, after_seconds=60)
    assert not busy.scale_to_zero and clock.last_busy == 61
    assert not decide(clock, 1, [None], now=500, after_seconds=60).scale_to_zero, "no answer"


def test_no_ready_pod_is_busy_and_wants_the_activator() -> None:
    clock = IdleClock(last_busy=0.0, replicas=1)
    starting = decide(clock, 1, [], now=100, after_seconds=60)
    assert starting.slice_wanted and not starting.scale_to_zero and clock.last_busy == 100
    at_zero = decide(clock, 0, [], now=1000, after_seconds=60)
    assert at_zero.slice_wanted and not at_zero.scale_to_zero


def test_coming_back_from_zero_restarts_the_idle_period() -> None:
    clock = IdleClock(last_busy=0.0, replicas=0)
    woken = decide(clock, 1, [0.0], now=1000, after_seconds=60)
    assert not woken.scale_to_zero and not woken.slice_wanted and clock.last_busy == 1000


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, dict[str, float]]]:
    load = {"running": 0.0, "waiting": 0.0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = METRICS.format(**load).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", load
    server.shutdown()


def test_pod_load_is_running_plus_waiting_from_metrics(metrics_server) -> None:
    url, load = metrics_server
    assert pod_load(url) == 0.0
    load.update(running=2.0, waiting=3.0)
    assert pod_load(url) == 5.0
    assert pod_load("http://127.0.0.1:9") is None, "nothing listens: cannot be judged"


def test_activator_slice_joins_the_service_under_its_port_name() -> None:
    piece = activator_slice(isvc(TO_ZERO), ActivatorAddress("10.1.2.3", 8082))
    labels = piece["metadata"]["labels"]
    assert labels["kubernetes.io/service-name"] == "chat"
    assert labels["endpointslice.kubernetes.io/managed-by"] == "activator.octavo.dev"
    assert piece["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert piece["addressType"] == "IPv4"
    assert piece["endpoints"] == [{"addresses": ["10.1.2.3"], "conditions": {"ready": True}}]
    assert piece["ports"] == [{"name": "http", "port": 8082, "protocol": "TCP"}]
    assert activator_slice(isvc(TO_ZERO), ActivatorAddress("fd00::5", 8082))["addressType"] == (
        "IPv6"
    )


@pytest.mark.parametrize(
    "host",
    ["chat.team-a.svc.cluster.local:8000", "chat.team-a.svc.cluster.local", "chat.team-a.svc",
     "chat.team-a:8000", "CHAT.team-a.svc.cluster.local."],
)  # fmt: skip
def test_the_host_header_names_the_service(host: str) -> None:
    assert target_from_host(host, lambda: None) == Target("team-a", "chat")


def test_a_bare_name_takes_the_callers_namespace() -> None:
    assert target_from_host("chat:8000", lambda: "team-b") == Target("team-b", "chat")
    with pytest.raises(UnknownTarget, match="caller's namespace is unknown"):
        target_from_host("chat", lambda: None)
    for host in ("10.0.0.7:8082", "[fd00::1]:8082", "chat.team-a.example.com"):
        with pytest.raises(UnknownTarget):
            target_from_host(host, lambda: "team-b")


def test_min_replicas_zero_keeps_the_hpa_at_one_and_admits_the_activator() -> None:
    policy = {"networkPolicy": {"enabled": True}}
    service = isvc({**TO_ZERO, **policy})
    assert service.scales_to_zero and service.desired_replicas == 0
    assert horizontal_pod_autoscaler(service)["spec"]["minReplicas"] == 1
    assert OPERATOR_PODS in network_policy(service)["spec"]["ingress"][0]["from"]
    always_up = network_policy(isvc(policy))["spec"]["ingress"][0]["from"]
    assert OPERATOR_PODS not in always_up


def test_a_service_at_zero_is_ready_through_the_activator() -> None:
    idle = {"metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": {}}
    _, conds = compute(isvc({**TO_ZERO, "replicas": 0}), Observed(deployment=idle))
    ready = next(c for c in conds if c.type == "Ready")
    assert (ready.status, ready.reason) == (True, "ScaledToZero")
    assert "the first request to http://chat.team-a.svc.cluster.local:8000/v1" in ready.message
    _, conds = compute(isvc({"replicas": 0}), Observed(deployment=idle))
    assert next(c for c in conds if c.type == "Ready").status is False
