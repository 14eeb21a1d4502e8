"""Scale from zero through the InferencePool (spec.router with autoscaling.minReplicas 0).

A gateway sends a routed service's requests to the pods its endpoint picker names, never to
the Service, so the activator's EndpointSlice does not see them. Instead the picker holds
them: with scale to zero its EndpointPickerConfig turns on the llm-d router's flow control,
whose queue is a scale-from-zero waiting room while the pool has no endpoints (requests wait
up to `flowControl.defaultRequestTTL`). The operator reads the picker's
`llm_d_epp_flow_control_queue_size` while the service is at zero and sets it to 1 replica
through /scale, as the activator does; once the pod is ready it joins the pool and the
picker dispatches the held requests to it.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from octavo_operator import constants as c
from octavo_operator.activator_waker import ServiceWaker
from octavo_operator.adapter_sync import ready_pod_addresses
from octavo_operator.api.service import InferenceService
from octavo_operator.builders.picker import picker_selector
from octavo_operator.kube import Kube

logger = logging.getLogger(__name__)
QUEUE_METRIC = "llm_d_epp_flow_control_queue_size"
SCRAPE_TIMEOUT_SECONDS = 2.0
Scraper = Callable[[str], str | None]  # metrics URL -> its text, None when it did not answer


def queued_requests(text: str) -> float:
    """Requests the picker holds in its flow-control queue (every band and flow)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == QUEUE_METRIC:
            total += sum(sample.value for sample in family.samples)
    return total


def fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_SECONDS) as response:
            return response.read().decode()
    except OSError:
        return None


def picker_metrics_urls(kube: Kube, isvc: InferenceService) -> list[str]:
    """The /metrics of each ready picker pod (the leader holds the queue)."""
    selector = ",".join(f"{k}={v}" for k, v in picker_selector(isvc).items())
    path = f"/api/v1/namespaces/{isvc.namespace}/pods"
    pods = kube.call("GET", path, query=[("labelSelector", selector)]).get("items") or []
    addresses = ready_pod_addresses(pods)
    return [f"http://{ip}:{c.PICKER_METRICS_PORT}/metrics" for _, ip in sorted(addresses.items())]


def held_requests(kube: Kube, isvc: InferenceService, scrape: Scraper = fetch) -> float:
    total = 0.0
    for url in picker_metrics_urls(kube, isvc):
        text = scrape(url)
        if text is not None:
            try:
                total += queued_requests(text)
            except ValueError:  # not Prometheus text: nothing to read
                logger.debug("unreadable metrics at %s", url)
    return total


def at_zero_behind_a_picker(isvc: InferenceService) -> bool:
    return isvc.router is not None and isvc.scales_to_zero and isvc.desired_replicas == 0


def wake_if_requests_wait(kube: Kube, body: dict[str, Any], scrape: Scraper = fetch) -> bool:
    """True when the picker held requests and the service was set from 0 to 1 replica."""
    isvc = InferenceService.from_body(body)
    if not at_zero_behind_a_picker(isvc):
        return False
    try:
        waiting = held_requests(kube, isvc, scrape)
    except client.ApiException as error:
        logger.warning(
            "cannot list the picker pods of %s/%s: %s", isvc.namespace, isvc.name, error.reason
        )
        return False
    if waiting <= 0:
        return False
    return ServiceWaker(kube).wake(body)
