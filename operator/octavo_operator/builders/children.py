"""Every child of an InferenceService, and the optional ones its spec turns off."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo_operator.api.service import InferenceService

from .adapters import adapters_config_map, adapters_config_map_name
from .autoscaler import horizontal_pod_autoscaler
from .cache_claim import cache_claim
from .deployment import deployment
from .disruption_budget import pod_disruption_budget
from .network_policy import network_policy
from .service import service
from .service_monitor import service_monitor


@dataclass(frozen=True)
class ChildRef:
    """Enough to address a child through the API: its apiVersion, kind and name."""

    api_version: str
    kind: str
    name: str


@dataclass
class DesiredChildren:
    apply: list[dict[str, Any]] = field(default_factory=list)  # in this order
    remove: list[ChildRef] = field(default_factory=list)  # optional children turned off


def desired_children(
    isvc: InferenceService, default_image: str, service_monitors_served: bool
) -> DesiredChildren:
    """The Deployment comes first (after the adapter list its pods read): it is what
    users wait for."""
    out = DesiredChildren()
    if isvc.adapters:  # before the Deployment: its pods read it when they start
        out.apply.append(adapters_config_map(isvc))
    else:
        out.remove.append(ChildRef("v1", "ConfigMap", adapters_config_map_name(isvc)))
    out.apply.append(deployment(isvc, isvc.image or default_image))
    out.apply.append(service(isvc))
    if isvc.cache is not None and isvc.cache.size is not None:
        out.apply.append(cache_claim(isvc))
    optional = [
        (
            isvc.disruption_budget is not None,
            pod_disruption_budget,
            "policy/v1",
            "PodDisruptionBudget",
        ),
        (
            isvc.autoscaling is not None,
            horizontal_pod_autoscaler,
            "autoscaling/v2",
            "HorizontalPodAutoscaler",
        ),
        (
            isvc.network_policy is not None,
            network_policy,
            "networking.k8s.io/v1",
            "NetworkPolicy",
        ),
    ]
    if service_monitors_served:
        wanted = isvc.monitoring.service_monitor
        optional.append((wanted, service_monitor, "monitoring.coreos.com/v1", "ServiceMonitor"))
    for wanted, build, api_version, kind in optional:
        if wanted:
            out.apply.append(build(isvc))
        else:
            out.remove.append(ChildRef(api_version, kind, isvc.name))
    return out
