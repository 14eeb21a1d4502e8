"""Scale to zero (autoscaling.minReplicas 0): the operator's half of it.

On a timer per autoscaled InferenceService, the leader looks at each ready pod's /metrics
and judges whether it carried a request since the previous look (pod_activity.py: requests
in flight, or a change of the counters every request moves, so a request shorter than the
timer's period is not missed). A service whose pods have carried no request for
``scaleToZeroAfterSeconds`` is set to 0 replicas through its /scale subresource, as the
HPA writes it (the HPA then pauses: it does not scale a target at 0). While a service has
no ready pod, an extra EndpointSlice sends its Service's traffic to the activator
(activator.py), which sets replicas back to 1 and holds the requests until a pod answers.
The slice is removed once a pod is ready.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService
from octavo_operator.builders.activator_slice import (
    ActivatorAddress,
    activator_slice,
    activator_slice_name,
)
from octavo_operator.kube import Kube, object_path
from octavo_operator.pod_activity import PodSample, carried_requests

logger = logging.getLogger(__name__)
Samples = dict[str, PodSample | None]  # pod name -> its sample (None: /metrics did not answer)


@dataclass
class IdleClock:
    """What the idle scaler remembers of one service between its timer's ticks."""

    last_busy: float
    replicas: int
    slice_present: bool | None = None  # None: not known (this process has not written it)
    pods: dict[str, PodSample] = field(default_factory=dict)  # the last sample of each pod


@dataclass(frozen=True)
class IdleDecision:
    scale_to_zero: bool
    slice_wanted: bool


def decide(
    clock: IdleClock, replicas: int, samples: Samples, now: float, after_seconds: float
) -> IdleDecision:
    """Update ``clock`` with this tick's samples (one per ready pod) and say what to do. A
    service without a ready pod, or with a pod that did not answer, counts as busy (it is
    starting, or cannot be judged); coming back from 0 restarts the idle period."""
    if clock.replicas == 0 and replicas > 0:
        clock.last_busy = now
    clock.replicas = replicas
    if replicas > 0 and _busy(clock.pods, samples):
        clock.last_busy = now
    clock.pods = {
        name: sample or clock.pods[name]
        for name, sample in samples.items()
        if sample is not None or name in clock.pods
    }
    return IdleDecision(
        scale_to_zero=replicas > 0 and now - clock.last_busy >= after_seconds,
        slice_wanted=not samples,
    )


def _busy(previous: dict[str, PodSample], samples: Samples) -> bool:
    if not samples:
        return True
    return any(
        sample is None or carried_requests(previous.get(name), sample)
        for name, sample in samples.items()
    )


class IdleScaler:
    def __init__(self, kube: Kube, activator: ActivatorAddress | None) -> None:
        self.kube = kube
        self.activator = activator
        self.clocks: dict[tuple[str, str], IdleClock] = {}

    def forget(self, key: tuple[str, str]) -> None:
        self.clocks.pop(key, None)

    def check(self, body: dict[str, Any], samples: Samples, now: float) -> bool:
        """One tick for one service, given its ready pods' samples; True when it was just
        scaled to zero."""
        isvc = InferenceService.from_body(body)
        key = (isvc.namespace, isvc.name)
        replicas = isvc.desired_replicas
        clock = self.clocks.setdefault(key, IdleClock(last_busy=now, replicas=replicas))
        if not isvc.scales_to_zero:
            self._keep_slice(isvc, clock, wanted=False)
            return False
        decision = decide(
            clock, replicas, samples, now, isvc.autoscaling.scale_to_zero_after_seconds
        )
        self._keep_slice(isvc, clock, wanted=decision.slice_wanted or decision.scale_to_zero)
        if decision.scale_to_zero and self._scale_to_zero(body):
            clock.replicas = 0
            return True
        return False

    def _keep_slice(self, isvc: InferenceService, clock: IdleClock, wanted: bool) -> None:
        """Write or delete the activator's EndpointSlice when its state changes."""
        if clock.slice_present == wanted:
            return
        if wanted and self.activator is None:
            logger.warning(
                "%s/%s is at zero but no activator address is set (POD_IP): its "
                "requests fail until a pod runs",
                isvc.namespace,
                isvc.name,
            )
            clock.slice_present = False
            return
        if wanted:
            self.kube.apply(activator_slice(isvc, self.activator))
        else:
            self.kube.delete(
                "discovery.k8s.io/v1", "EndpointSlice", isvc.namespace, activator_slice_name(isvc)
            )
        clock.slice_present = wanted

    def _scale_to_zero(self, body: dict[str, Any]) -> bool:
        """replicas 0 through /scale, only if the service was not changed meanwhile."""
        meta = body["metadata"]
        path = object_path(c.API_VERSION, c.KIND, meta["namespace"], meta["name"]) + "/scale"
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": {"replicas": 0}}
        try:
            self.kube.merge_patch(path, patch)
        except client.ApiException as error:
            if error.status in (404, 409):  # gone, or changed: the next tick decides again
                return False
            raise
        logger.info("%s/%s idle: scaled to zero", meta["namespace"], meta["name"])
        return True
