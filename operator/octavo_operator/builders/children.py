"""Every child of an InferenceService, and the optional ones its spec turns off."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .adapters import adapters_config_map, adapters_config_map_name
from .autoscaler import horizontal_pod_autoscaler
from .cache_claim import cache_claim
from .deployment import deployment
from .disruption_budget import pod_disruption_budget, prefill_disruption_budget
from .inference_pool import inference_pool
from .leader_worker_set import leader_worker_set
from .network_policy import network_policy, wants_network_policy
from .picker import picker_deployment, picker_service
from .picker_config import picker_config_map
from .picker_rbac import picker_role, picker_role_binding, picker_service_account
from .pod_monitor import prefill_pod_monitor
from .prefill import prefill_deployment
from .routing_sidecar import sidecar_role, sidecar_role_binding, sidecar_service_account
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
    # spec.prefill off (or invalid): the prefill pool and its sidecar's RBAC, removed like
    # `remove` after everything is applied (the decode pods no longer route to it by then)
    remove_prefill: list[ChildRef] = field(default_factory=list)

    @property
    def removals(self) -> list[ChildRef]:
        return [*self.remove, *self.remove_prefill]


def desired_children(
    isvc: InferenceService,
    default_image: str,
    service_monitors_served: bool,
    inference_pools_served: bool = False,
    picker_image: str = c.DEFAULT_PICKER_IMAGE,
    leader_worker_sets_served: bool = False,
    sidecar_image: str = c.DEFAULT_SIDECAR_IMAGE,
    pod_monitors_served: bool = False,
) -> DesiredChildren:
    """The workload comes first (after the adapter list its pods read): it is what
    users wait for."""
    out = DesiredChildren()
    if isvc.adapters:  # before the workload: its pods read it when they start
        out.apply.append(adapters_config_map(isvc))
    else:
        out.remove.append(ChildRef("v1", "ConfigMap", adapters_config_map_name(isvc)))
    server_image = isvc.image or default_image
    add_prefill_children(out, isvc, server_image)  # the decode pods' sidecar reads its RBAC
    add_workload(out, isvc, server_image, leader_worker_sets_served, sidecar_image)
    out.apply.append(service(isvc))
    if isvc.cache is not None and isvc.cache.size is not None:
        out.apply.append(cache_claim(isvc))
    add_optional_children(out, isvc, service_monitors_served)
    add_prefill_budget_and_monitor(out, isvc, pod_monitors_served)
    add_router_children(out, isvc, inference_pools_served, picker_image, default_image)
    return out


def add_optional_children(
    out: DesiredChildren, isvc: InferenceService, service_monitors_served: bool
) -> None:
    """The PDB, HPA, NetworkPolicy and ServiceMonitor the spec asks for; each one it does
    not ask for (any more) is removed."""
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
            wants_network_policy(isvc),
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


def group_refs(isvc: InferenceService) -> list[ChildRef]:
    """A multi-node replica's LeaderWorkerSet and its node key Secret."""
    return [
        ChildRef(c.LWS_API, c.LWS_KIND, isvc.group_name),
        ChildRef("v1", "Secret", isvc.node_key_secret_name),
    ]


def add_workload(
    out: DesiredChildren,
    isvc: InferenceService,
    image: str,
    lws_served: bool,
    sidecar_image: str = c.DEFAULT_SIDECAR_IMAGE,
) -> None:
    """A Deployment, or with engine.nodes > 1 a LeaderWorkerSet (and never both: the other
    one goes). Without the LeaderWorkerSet API nothing runs the service; the status says
    why (LeaderWorkerSetAPIMissing) and the next reconcile after its CRD appears applies it."""
    if not isvc.engine.multi_node:
        out.apply.append(deployment(isvc, image, sidecar_image))
        if lws_served:  # else there is no group (and its key was never made)
            out.remove += group_refs(isvc)
        return
    out.remove.append(ChildRef("apps/v1", "Deployment", isvc.name))
    if lws_served:
        out.apply.append(leader_worker_set(isvc, image))


def prefill_refs(isvc: InferenceService) -> list[ChildRef]:
    """The routing sidecar's RBAC and the prefill pool's Deployment (spec.prefill)."""
    name, rbac = isvc.sidecar_name, "rbac.authorization.k8s.io/v1"
    return [
        ChildRef("v1", "ServiceAccount", name),
        ChildRef(rbac, "Role", name),
        ChildRef(rbac, "RoleBinding", name),
        ChildRef("apps/v1", "Deployment", isvc.prefill_name),
    ]


def add_prefill_children(out: DesiredChildren, isvc: InferenceService, image: str) -> None:
    """With a valid spec.prefill: the sidecar's ServiceAccount, Role and RoleBinding, and
    the prefill Deployment. Without it, or while it is invalid (the status says why), they
    go: the decode Deployment then serves alone, without the sidecar."""
    if not isvc.disaggregated:
        out.remove_prefill += prefill_refs(isvc)
        return
    out.apply += [
        sidecar_service_account(isvc),
        sidecar_role(isvc),
        sidecar_role_binding(isvc),
        prefill_deployment(isvc, image),
    ]


def add_prefill_budget_and_monitor(
    out: DesiredChildren, isvc: InferenceService, pod_monitors_served: bool
) -> None:
    """With a valid spec.prefill: the prefill pool's PodDisruptionBudget (beside
    spec.disruptionBudget's) and its PodMonitor (beside the ServiceMonitor, where the
    Prometheus Operator serves PodMonitors), both `<name>-prefill`; else they go."""
    optional = [
        (
            isvc.disruption_budget is not None,
            prefill_disruption_budget,
            ChildRef("policy/v1", "PodDisruptionBudget", isvc.prefill_name),
        )
    ]
    if pod_monitors_served:
        monitor = ChildRef("monitoring.coreos.com/v1", "PodMonitor", isvc.prefill_name)
        optional.append((isvc.monitoring.service_monitor, prefill_pod_monitor, monitor))
    for wanted, build, ref in optional:
        if not isvc.disaggregated:
            out.remove_prefill.append(ref)
        elif wanted:
            out.apply.append(build(isvc))
        else:
            out.remove.append(ref)


def picker_refs(isvc: InferenceService) -> list[ChildRef]:
    """The endpoint picker's objects, in the order they are applied (spec.router)."""
    name = isvc.picker_name
    return [
        ChildRef("v1", "ServiceAccount", name),
        ChildRef("rbac.authorization.k8s.io/v1", "Role", name),
        ChildRef("rbac.authorization.k8s.io/v1", "RoleBinding", name),
        ChildRef("v1", "ConfigMap", name),
        ChildRef("apps/v1", "Deployment", name),
        ChildRef("v1", "Service", name),
    ]


def add_router_children(
    out: DesiredChildren,
    isvc: InferenceService,
    pools_served: bool,
    picker_image: str,
    server_image: str,
) -> None:
    """With spec.router and the InferencePool API served: the picker's RBAC, config,
    Deployment and Service, then the pool that names it. Without the API nothing is
    applied (the status says why: a picker without its pool only fails). Turned off:
    all of them are removed (the pool only where its API exists)."""
    pool = ChildRef(c.INFERENCE_POOL_API, "InferencePool", isvc.name)
    if isvc.router is None:
        out.remove += [*picker_refs(isvc), *([pool] if pools_served else [])]
        return
    if not pools_served:
        return
    out.apply += [
        picker_service_account(isvc),
        picker_role(isvc),
        picker_role_binding(isvc),
        picker_config_map(isvc),
        picker_deployment(isvc, picker_image, isvc.image or server_image),
        picker_service(isvc),
        inference_pool(isvc),
    ]
