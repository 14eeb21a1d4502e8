"""Scale to zero, the operator's parts without a cluster: the idle decision, a pod's
activity read from the server's own /metrics text (requests shorter than the timer's
period, restarts), the activator's EndpointSlice, the Host -> service lookup, and what
minReplicas 0 changes in the children and the status."""

from __future__ import annotations

import http.server
import itertools
import threading
from collections.abc import Iterator

import pytest

from octavo.engine.stats import EngineStats
from octavo.entrypoints.openai.metrics import ServerMetrics
from octavo.outputs import CompletionOutput, RequestMetrics, RequestOutput
from octavo_operator.activator_target import Target, UnknownTarget, target_from_host
from octavo_operator.builders.activator_slice import ActivatorAddress, activator_slice
from octavo_operator.builders.autoscaler import horizontal_pod_autoscaler
from octavo_operator.builders.network_policy import OPERATOR_PODS, network_policy
from octavo_operator.idle_scaler import IdleClock, decide
from octavo_operator.pod_activity import PodSample, carried_requests, restart_count, scrape
from octavo_operator.status import Observed, compute

from isvc_factories import isvc

TO_ZERO = {"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfterSeconds": 60}}
TICK_SECONDS = 10  # the idle timer's period (handlers.IDLE_CHECK_SECONDS)
IDLE = PodSample(in_flight=0.0, served=(0.0, 0.0))


class FakePod:
    """A pod's /metrics, rendered by the server's own ServerMetrics as a pod exposes them;
    requests are served between scrapes, as a short request is."""

    def __init__(self) -> None:
        self.metrics = ServerMetrics("chat")
        self.ids = itertools.count()
        self.prompt_tokens = 0
        self.in_flight = 0
        self._publish()

    def _publish(self) -> None:
        self.metrics.engine_stats.update(
            EngineStats(
                num_running=self.in_flight,
                num_waiting=0,
                kv_cache_usage=0.0,
                kv_cache_tokens_held=0,
                kv_cache_slots_allocated=0,
                num_blocks=64,
                prefix_cache_queries=0,
                prefix_cache_hits=0,
                num_preemptions=0,
                prompt_tokens=self.prompt_tokens,
                generation_tokens=0,
            )
        )

    def start(self, prompt_tokens: int = 5) -> None:
        self.in_flight += 1
        self.prompt_tokens += prompt_tokens
        self._publish()

    def finish(self) -> None:
        self.in_flight -= 1
        done = CompletionOutput(
            index=0, text="hi", token_ids=[1], finish_reason="stop", num_tokens=1
        )
        self.metrics.record_finished(
            RequestOutput(
                request_id=f"r{next(self.ids)}",
                prompt="p",
                prompt_token_ids=[1],
                outputs=[done],
                finished=True,
                num_cached_tokens=0,
                metrics=RequestMetrics(arrival_time=0.0),
                num_prompt_tokens=5,
            )
        )
        self._publish()

    def short_request(self) -> None:
        """A request that starts and finishes between two scrapes."""
        self.start()
        self.finish()

    def restart(self) -> None:
        self.__init__()


@pytest.fixture
def fake_pod() -> Iterator[tuple[str, FakePod]]:
    pod = FakePod()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pod.metrics.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    serve.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", pod
    server.shutdown()


def tick(clock: IdleClock, url: str, now: float, restarts: int = 0) -> bool:
    """One timer tick of a one-pod service: True when it decides to scale to zero."""
    samples = {"chat-0": scrape(url, restarts)}
    return decide(clock, 1, samples, now=now, after_seconds=60).scale_to_zero


def test_requests_shorter_than_the_tick_keep_a_service_up(fake_pod) -> None:
    """A 1-second request every 30 s is never in flight at a scrape: the counters it moves
    keep the service up; once they stop, it goes to zero after the idle period."""
    url, pod = fake_pod
    clock = IdleClock(last_busy=0.0, replicas=1)
    for now in range(0, 600, TICK_SECONDS):
        if now % 30 == 0:
            pod.short_request()
        assert not tick(clock, url, now), f"scaled to zero at {now} s while serving"
        assert clock.pods["chat-0"].in_flight == 0, "never seen in flight"
    quiet = [now for now in range(600, 700, TICK_SECONDS) if tick(clock, url, now)]
    assert quiet and quiet[0] == 630, "60 s after the last request (at 570 s)"


def test_a_request_aborted_before_it_finished_counts(fake_pod) -> None:
    url, pod = fake_pod
    clock = IdleClock(last_busy=0.0, replicas=1)
    assert not tick(clock, url, 0)
    pod.start()  # its prompt was prefilled; it was aborted (counted under "abort") or is
    pod.in_flight = 0  # lost with the scrape; the prompt tokens moved all the same
    pod._publish()
    assert not tick(clock, url, 59) and clock.last_busy == 59


def test_a_restarted_server_counts_as_busy(fake_pod) -> None:
    url, pod = fake_pod
    clock = IdleClock(last_busy=0.0, replicas=1)
    for _ in range(3):
        pod.short_request()
    assert not tick(clock, url, 0)
    pod.restart()  # the counters start again from 0: a reset, not idleness
    pod.short_request()
    assert not tick(clock, url, 59) and clock.last_busy == 59, "counters went down"
    assert not tick(clock, url, 118, restarts=1) and clock.last_busy == 118, "restart count"
    assert tick(clock, url, 178, restarts=1), "nothing since: idle for 60 s"


def test_activity_rules() -> None:
    served = PodSample(in_flight=0.0, served=(3.0, 15.0))
    assert carried_requests(None, served), "first look: it served since it started"
    assert not carried_requests(None, IDLE)
    assert not carried_requests(served, served)
    assert carried_requests(served, PodSample(0.0, (4.0, 20.0))), "finished one"
    assert carried_requests(served, PodSample(0.0, (3.0, 20.0))), "prefilled one"
    assert carried_requests(served, PodSample(0.0, (0.0, 0.0))), "reset: restarted"
    assert carried_requests(served, PodSample(0.0, (3.0, 15.0), restarts=1)), "restarted"
    assert carried_requests(served, PodSample(1.0, (3.0, 15.0))), "one in flight"
    pod = {"status": {"containerStatuses": [{"restartCount": 2}, {"restartCount": 1}]}}
    assert restart_count(pod) == 3 and restart_count({"status": {}}) == 0


def test_idle_time_counts_only_while_no_request_runs_or_waits() -> None:
    clock = IdleClock(last_busy=0.0, replicas=1)
    assert not decide(clock, 1, {"p": IDLE}, now=30, after_seconds=60).scale_to_zero
    assert decide(clock, 1, {"p": IDLE, "q": IDLE}, now=60, after_seconds=60).scale_to_zero
    busy = decide(clock, 1, {"p": IDLE, "q": PodSample(2.0, (0.0, 0.0))}, now=61, after_seconds=60)
    assert not busy.scale_to_zero and clock.last_busy == 61
    assert not decide(clock, 1, {"p": None}, now=500, after_seconds=60).scale_to_zero, "no answer"


def test_a_pod_that_did_not_answer_keeps_its_last_sample() -> None:
    clock, same = IdleClock(last_busy=0.0, replicas=1), PodSample(0.0, (1.0, 5.0))
    decide(clock, 1, {"p": same}, now=0, after_seconds=60)
    decide(clock, 1, {"p": None}, now=10, after_seconds=60)
    assert clock.pods["p"] == same and clock.last_busy == 10, "unanswered: busy"
    assert not decide(clock, 1, {"p": same}, now=69, after_seconds=60).scale_to_zero
    assert decide(clock, 1, {"p": same}, now=70, after_seconds=60).scale_to_zero


def test_no_ready_pod_is_busy_and_wants_the_activator() -> None:
    clock = IdleClock(last_busy=0.0, replicas=1)
    starting = decide(clock, 1, {}, now=100, after_seconds=60)
    assert starting.slice_wanted and not starting.scale_to_zero and clock.last_busy == 100
    at_zero = decide(clock, 0, {}, now=1000, after_seconds=60)
    assert at_zero.slice_wanted and not at_zero.scale_to_zero


def test_coming_back_from_zero_restarts_the_idle_period() -> None:
    clock = IdleClock(last_busy=0.0, replicas=0)
    woken = decide(clock, 1, {"p": IDLE}, now=1000, after_seconds=60)
    assert not woken.scale_to_zero and not woken.slice_wanted and clock.last_busy == 1000


def test_a_pod_sample_is_read_from_the_servers_metrics(fake_pod) -> None:
    url, pod = fake_pod
    assert scrape(url) == IDLE
    pod.start(prompt_tokens=7)
    pod.start(prompt_tokens=3)
    pod.finish()
    assert scrape(url, restarts=2) == PodSample(in_flight=1.0, served=(1.0, 10.0), restarts=2)
    assert scrape("http://127.0.0.1:9") is None, "nothing listens: cannot be judged"


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
    [
        "chat.team-a.svc.cluster.local:8000",
        "chat.team-a.svc.cluster.local",
        "chat.team-a.svc",
        "chat.team-a:8000",
        "CHAT.team-a.svc.cluster.local.",
    ],
)
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
