"""Whether a ready pod carried a request since the idle scaler last looked at it.

Requests running + waiting (gauges) say only what is in flight at the instant of a scrape:
a 1-second request a minute, scraped every 10 s, is seen one time in ten. So each look
also reads counters that every request moves, however short — finished requests (any
reason: ``vllm:request_success_total``) and prompt tokens (``vllm:prompt_tokens_total``,
counted as a request is prefilled) — and the pod's container restart count. A pod carried
a request since the previous look when one is in flight now or any of these changed: a
counter that went up served something, one that went down was reset (the server
restarted, Prometheus's rule for resets), and so did a changed restart count.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from octavo_operator import constants as c
from octavo_operator.adapter_sync import ready_pod_addresses

IN_FLIGHT_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
ACTIVITY_COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total")
SCRAPE_TIMEOUT_SECONDS = 3


@dataclass(frozen=True)
class PodSample:
    """One look at one ready pod."""

    in_flight: float  # requests running + waiting
    served: tuple[float, ...]  # ACTIVITY_COUNTERS, in their order (summed over labels)
    restarts: int = 0  # its containers' restarts, from the pod object


def carried_requests(previous: PodSample | None, current: PodSample) -> bool:
    """Whether the pod carried a request between PREVIOUS and CURRENT; at the first look
    (no PREVIOUS), whether it has carried any since it started."""
    if current.in_flight > 0:
        return True
    if previous is None:
        return any(current.served)
    return current.served != previous.served or current.restarts != previous.restarts


def parse_sample(text: str, restarts: int = 0) -> PodSample:
    """A sample from a /metrics text (Prometheus exposition format). Only the lines of the
    series read here are parsed: a scrape holds hundreds of others (histograms)."""
    in_flight, served = 0.0, dict.fromkeys(ACTIVITY_COUNTERS, 0.0)
    wanted = [line for line in text.splitlines() if _is_read_here(line)]
    for family in text_string_to_metric_families("\n".join(wanted) + "\n"):
        for sample in family.samples:
            if sample.name in IN_FLIGHT_GAUGES:
                in_flight += sample.value
            elif sample.name in served:
                served[sample.name] += sample.value
    return PodSample(in_flight, tuple(served.values()), restarts)


def _is_read_here(line: str) -> bool:
    name = line.split("{", 1)[0].split(" ", 1)[0]
    return name in IN_FLIGHT_GAUGES or name in ACTIVITY_COUNTERS


def scrape(base_url: str, restarts: int = 0) -> PodSample | None:
    """One pod's sample; None when its /metrics did not answer or made no sense."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=SCRAPE_TIMEOUT_SECONDS) as r:
            return parse_sample(r.read().decode(), restarts)
    except (OSError, ValueError):
        return None


def restart_count(pod: dict[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(status.get("restartCount") or 0) for status in statuses)


def pod_samples(pods: list[dict[str, Any]]) -> dict[str, PodSample | None]:
    """Pod name -> sample of each ready pod (HTTP: call it outside the service's lock)."""
    restarts = {(p.get("metadata") or {}).get("name", "?"): restart_count(p) for p in pods}
    return {
        name: scrape(f"http://{ip}:{c.SERVER_PORT}", restarts.get(name, 0))
        for name, ip in ready_pod_addresses(pods).items()
    }
