"""kopf handlers: thin glue between watch events and the Controller.

- InferenceService created, changed or seen at start-up -> reconcile (apply children) and
  write its status;
- a child deleted or changed by someone else -> reconcile its owner (drift correction);
- a child's or pod's status changed, or a claim appeared -> rewrite the owner's status.
In-memory indexes (kopf.index) hold the latest copy of every watched object, so computing a
status reads no API.  Run with `octavo-operator`, or `kopf run -m octavo_operator.handlers`.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import kopf
from kubernetes import client

from octavo_operator import constants as c
from octavo_operator import metrics
from octavo_operator.adapter_sync import sync_adapters
from octavo_operator.api.service import InferenceService
from octavo_operator.builders.activator_slice import ActivatorAddress
from octavo_operator.elastic_executor import ElasticExecutor
from octavo_operator.kube import Kube, always, api_error_message, load_api_client
from octavo_operator.picker_wakeup import wake_if_requests_wait
from octavo_operator.pod_activity import pod_samples
from octavo_operator.pod_adapters import PodAdapterAPI
from octavo_operator.reconcile import (
    Applied,
    Controller,
    Key,
    Settings,
    TransientError,
    child_identity,
)
from octavo_operator.reconcile_retry import RETRY_DELAY_SECONDS, RetriedReconcile
from octavo_operator.status import Observed, deployment_summary, workload_kind
from octavo_operator.status_queue import StatusQueue
from octavo_operator.sweep import Sweeper

ISVC = (c.GROUP, c.VERSION, c.PLURAL)
OWNED = {c.MANAGED_BY_LABEL: c.MANAGED_BY}
CHILD_RESOURCES = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "persistentvolumeclaims"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    ("monitoring.coreos.com", "v1", "servicemonitors"),
    ("monitoring.coreos.com", "v1", "podmonitors"),  # spec.prefill's pool
    ("", "v1", "configmaps"),
    # spec.router: the endpoint picker's RBAC and the InferencePool (watched once its CRD
    # exists: kopf follows CRDs as they come and go).
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("inference.networking.k8s.io", "v1", "inferencepools"),
    # engine.nodes > 1: the LeaderWorkerSet (watched once its CRD exists, like the pool).
    ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
)
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
POD_MONITOR_CRD = "podmonitors.monitoring.coreos.com"
MONITORING_API = "monitoring.coreos.com/v1"
DISCOVERY_WAIT_SECONDS = 10
ADAPTER_SYNC_SECONDS = float(os.environ.get("OCTAVO_OPERATOR_ADAPTER_SYNC_SECONDS", "10"))
IDLE_CHECK_SECONDS = float(os.environ.get("OCTAVO_OPERATOR_IDLE_CHECK_SECONDS", "10"))
PICKER_WAKE_SECONDS = float(os.environ.get("OCTAVO_OPERATOR_PICKER_WAKE_SECONDS", "1"))
logger = logging.getLogger(__name__)


def plain(body: Any) -> dict[str, Any]:
    """A copy of ``body`` without ``metadata.managedFields`` (often most of an object)."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return copy.deepcopy({**body, "metadata": meta})


def first(store: Any) -> Any:
    return next(iter(store), None) if store is not None else None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our own Events say what happened
    settings.posting.reporting_component = c.MANAGED_BY  # "From" in kubectl describe
    settings.posting.reporting_instance = os.environ.get("POD_NAME") or socket.gethostname()
    # Handlers mostly wait on the apiserver: more threads than the old 16 (p50 2.9 s / p99
    # 5.2 s for a burst of 100 creates on 2 cores, e2e/bench_operator.py) serve a burst
    # sooner; the figures for this default are in the README.
    settings.execution.max_workers = int(os.environ.get("OCTAVO_OPERATOR_WORKERS", "128"))
    # Threads for a burst, gone (stacks and allocator caches freed) once it is over.
    settings.execution.executor = ElasticExecutor(settings.execution.max_workers, name="handler")
    settings.batching.batch_window = 0.05
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    workers = settings.execution.max_workers
    api = load_api_client(os.environ.get("KUBECONFIG") or None, pool_size=workers + 4)
    kube = Kube(api, may_write=memo.get("may_write") or always)  # runner: Leadership.leads
    image = os.environ.get("OCTAVO_OPERATOR_DEFAULT_IMAGE") or c.DEFAULT_SERVER_IMAGE
    picker = os.environ.get("OCTAVO_OPERATOR_PICKER_IMAGE") or c.DEFAULT_PICKER_IMAGE
    sidecar = os.environ.get("OCTAVO_OPERATOR_SIDECAR_IMAGE") or c.DEFAULT_SIDECAR_IMAGE
    wanted = Settings(
        default_image=image, activator=activator(), picker_image=picker, sidecar_image=sidecar
    )
    memo.controller = Controller(kube, wanted)
    # After deletions, also close the API connections a burst opened (TLS state per socket).
    memo.controller.trimmer.releases.append(kube.api.rest_client.pool_manager.clear)
    memo.controller.statuses = StatusQueue(partial(write_status_now, memo.controller))
    memo.controller.drift_checks = ThreadPoolExecutor(4, thread_name_prefix="drift")
    indexes = indexes_of(kwargs)  # kopf's live indexes (empty until the first events)
    check = partial(check_drift_later, memo.controller, indexes=indexes)
    Sweeper(memo.controller, CHILD_RESOURCES, check).start()


def activator() -> ActivatorAddress | None:
    """The activator's address and port, as runner.start_activator left them."""
    address = os.environ.get("OCTAVO_ACTIVATOR_ADDRESS")
    port = os.environ.get("OCTAVO_ACTIVATOR_PORT")
    return ActivatorAddress(address, int(port)) if address and port else None


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """$KUBECONFIG as set by `--kubeconfig` (read now, not at import), else in-cluster."""
    return kopf.login_with_kubeconfig(**kwargs) or kopf.login_with_service_account(**kwargs)


@kopf.index(*ISVC)
def isvc_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, name): plain(body)}


def is_picker(labels: kopf.Labels) -> bool:
    return labels.get(c.COMPONENT_LABEL) == c.PICKER_COMPONENT


@kopf.index("apps", "v1", "deployments", labels=OWNED)
def deployment_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    """The servers' Deployments of each service (not its endpoint picker's): the one named
    after it and, with spec.prefill, the prefill pool's (told apart by name)."""
    if is_picker(labels):
        return {}
    return {(namespace, labels.get(c.INSTANCE_LABEL)): deployment_summary(body)}


@kopf.index("apps", "v1", "deployments", labels=OWNED)
def picker_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    """The endpoint picker's Deployment of each service with spec.router."""
    if not is_picker(labels):
        return {}
    return {(namespace, labels.get(c.INSTANCE_LABEL)): deployment_summary(body)}


@kopf.index("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", labels=OWNED)
def lws_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    """The LeaderWorkerSet of each service with engine.nodes > 1."""
    return {(namespace, labels.get(c.INSTANCE_LABEL)): deployment_summary(body)}


@kopf.index("", "v1", "pods", labels=OWNED)
def pod_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    """Name, status and component (a multi-node group's workers serve no HTTP)."""
    component = {c.COMPONENT_LABEL: labels.get(c.COMPONENT_LABEL)}
    meta = {"name": body.metadata.name, "labels": component}
    summary = {"metadata": meta, "status": dict(body.status)}
    return {(namespace, labels.get(c.INSTANCE_LABEL)): copy.deepcopy(summary)}


@kopf.index("", "v1", "persistentvolumeclaims")
def claim_index(namespace: str, name: str, **_: Any) -> dict:
    return {(namespace, name): True}


def name_of(summary: dict[str, Any]) -> str | None:
    return (summary.get("metadata") or {}).get("name")


def named(store: Any, name: str) -> dict[str, Any] | None:
    """The summary in an index's STORE (all objects under one key) whose name is NAME."""
    return next((o for o in store or () if name_of(o) == name), None)


def newest(*objs: dict[str, Any] | None) -> dict[str, Any] | None:
    def version(obj: dict[str, Any]) -> int:
        rv = (obj.get("metadata") or {}).get("resourceVersion", "0")
        return int(rv) if str(rv).isdigit() else 0

    present = [o for o in objs if o]
    return max(present, key=version) if present else None


def missing_claims(body: dict[str, Any], claim_index: kopf.Index) -> list[tuple[str, str]]:
    isvc = InferenceService.from_body(body)
    return [
        (role, claim) for role, claim in isvc.claims if (isvc.namespace, claim) not in claim_index
    ]


def workload(
    isvc: InferenceService, applied: Applied | None, indexes: dict[str, Any]
) -> dict[str, Any] | None:
    """The newest copy of the service's Deployment, or LeaderWorkerSet with engine.nodes
    > 1 (never the other kind, left over from before a change of engine.nodes)."""
    kind = workload_kind(isvc)
    index = "lws_index" if isvc.engine.multi_node else "deployment_index"
    store = indexes[index].get((isvc.namespace, isvc.name)) or ()
    indexed = first([o for o in store if name_of(o) != isvc.prefill_name])
    own = applied.deployment if applied else None
    return newest(indexed, own if own and own.get("kind", kind) == kind else None)


def observe(ctl: Controller, key: Key, body: dict[str, Any], indexes: dict[str, Any]) -> Observed:
    applied = ctl.applied.get(key)
    return Observed(
        applied_generation=applied.generation if applied else None,
        apply_error=applied.error if applied else None,
        deployment=workload(InferenceService.from_body(body), applied, indexes),
        pods=list(indexes["pod_index"].get(key, [])),
        missing_claims=missing_claims(body, indexes["claim_index"]),
        adapters=ctl.adapter_reports.get(key),
        pools_served=applied.pools_served if applied else None,
        picker=newest(first(indexes["picker_index"].get(key)), applied.picker if applied else None),
        lws_served=applied.lws_served if applied else None,
        prefill=newest(
            named(indexes["deployment_index"].get(key), f"{key[1]}{c.PREFILL_SUFFIX}"),
            applied.prefill if applied else None,
        ),
        prefill_conflict=applied.prefill_conflict if applied else None,
    )


INDEXES = (
    "isvc_index",
    "deployment_index",
    "picker_index",
    "lws_index",
    "pod_index",
    "claim_index",
)


def indexes_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    """kopf's live in-memory indexes, for a status written later on another thread."""
    return {name: kwargs[name] for name in INDEXES}


def write_status_now(ctl: Controller, key: Key, indexes: dict[str, Any]) -> None:
    """The status from the newest copies of the service and its children (StatusQueue)."""
    owner = owner_of(ctl, indexes["isvc_index"], key)
    if owner is None:
        return
    with ctl.lock(key):
        ctl.write_status(owner, observe(ctl, key, owner, indexes))


@kopf.on.resume(*ISVC)
@kopf.on.create(*ISVC)
@kopf.on.update(*ISVC)
def reconcile_isvc(
    body: kopf.Body, namespace: str, name: str, reason: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    ctl: Controller = memo.controller
    if ctl.kopf_context is None:  # kept once, for the sweeper's drift checks
        ctl.kopf_context = contextvars.copy_context()
    key, owner = (namespace, name), plain(body)
    with ctl.lock(key):
        if owner_of(ctl, kwargs["isvc_index"], key) is None:
            return  # deleted while this event waited: nothing to apply, nothing to keep
        try:
            ctl.reconcile(owner, trigger=str(reason))
        except TransientError as error:
            raise kopf.TemporaryError(str(error), delay=RETRY_DELAY_SECONDS) from error
        finally:
            ctl.statuses.request(key, indexes_of(kwargs))


@kopf.on.event(*ISVC)
def on_isvc_event(
    event: kopf.RawEvent, namespace: str, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """A deleted InferenceService leaves nothing behind in the operator's memory."""
    if event.get("type") == "DELETED":
        memo.controller.forget((namespace, name))


def owner_of(ctl: Controller, isvc_index: kopf.Index, key: Key) -> dict[str, Any] | None:
    """The service's newest body from kopf's index; None once it is deleted or being
    deleted, or gone from the API server though its DELETED event was lost (sweep.py)."""
    owner = first(isvc_index.get(key))
    if owner is None or (owner.get("metadata") or {}).get("deletionTimestamp"):
        return None
    return None if ctl.is_gone(owner) else owner


async def on_child_event(
    event: kopf.RawEvent,
    body: kopf.Body,
    namespace: str,
    labels: kopf.Labels,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """On kopf's event loop, no thread hop: nearly every child event is our own apply's
    echo or a status change, checked in microseconds. A child someone else changed is put
    back on a drift-check thread, as is the check of an echo that arrives mid-reconcile."""
    key, ctl = (namespace, labels.get(c.INSTANCE_LABEL, "")), memo.controller
    if owner_of(ctl, kwargs["isvc_index"], key) is None:
        return
    child, deleted, indexes = (
        child_identity(body),
        event.get("type") == "DELETED",
        indexes_of(kwargs),
    )
    lock = ctl.lock(key)
    check_later = True  # mid-reconcile: check once the reconcile has recorded its applies
    if lock.acquire(blocking=False):
        try:
            check_later = ctl.drifted(key, child, deleted=deleted)
        finally:
            lock.release()
    if check_later:  # in kopf's context (a correction's status write posts Events)
        check_drift_later(ctl, key, child, deleted, indexes=indexes)
    ctl.statuses.request(key, indexes)


def correct_drift(
    ctl: Controller, key: Key, child: dict[str, Any], deleted: bool, indexes: dict[str, Any]
) -> None:
    """Put a child back if someone else deleted or changed it (caller holds the lock)."""
    owner = owner_of(ctl, indexes["isvc_index"], key)
    if owner is None or not ctl.drifted(key, child, deleted=deleted):
        return
    logger.info("%s %s/%s drifted; putting it back", child.get("kind"), *key)
    metrics.DRIFT_CORRECTIONS.labels(str(child.get("kind"))).inc()
    retried_reconcile(ctl, key, indexes, "drift").run(owner)


def retried_reconcile(
    ctl: Controller, key: Key, indexes: dict[str, Any], trigger: str
) -> RetriedReconcile:
    """A reconcile kopf does not retry; a retry that goes through rewrites the status."""
    return RetriedReconcile(
        ctl,
        key,
        find_owner=lambda: owner_of(ctl, indexes["isvc_index"], key),
        trigger=trigger,
        after_retry=lambda: ctl.statuses.request(key, indexes),
    )


def check_drift_later(
    ctl: Controller, key: Key, child: dict[str, Any], deleted: bool, *, indexes: dict[str, Any]
) -> None:
    """correct_drift_when_free on a drift-check thread, in the caller's context (kopf's: a
    correction's status write posts Events)."""
    run = contextvars.copy_context().run
    ctl.drift_checks.submit(run, correct_drift_when_free, ctl, key, child, deleted, indexes)


def correct_drift_when_free(
    ctl: Controller, key: Key, child: dict[str, Any], deleted: bool, indexes: dict[str, Any]
) -> None:
    """The check under the service's lock, on a drift-check thread (it may wait for a
    running reconcile, and may reconcile): kopf's loop and handler threads stay free."""
    with ctl.lock(key):
        correct_drift(ctl, key, child, deleted, indexes)


for _group, _version, _plural in CHILD_RESOURCES:
    kopf.on.event(_group, _version, _plural, labels=OWNED)(on_child_event)


@kopf.on.event("", "v1", "pods", labels=OWNED)
async def on_pod_event(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any) -> None:
    """On kopf's event loop: only asks for a status write (StatusQueue); a deleted pod
    also asks for memory to be given back once deletions are over."""
    if kwargs["event"].get("type") == "DELETED":
        memo.controller.trimmer.request()
    key = (namespace, labels.get(c.INSTANCE_LABEL, ""))
    if owner_of(memo.controller, kwargs["isvc_index"], key) is not None:
        memo.controller.statuses.request(key, indexes_of(kwargs))


def _has_adapters(spec: kopf.Spec, **_: Any) -> bool:
    return spec.get("adapters") is not None


@kopf.timer(*ISVC, interval=ADAPTER_SYNC_SECONDS, when=_has_adapters)
def on_adapter_timer(
    body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Load and unload spec.adapters in the ready pods (HTTP, outside the lock); then
    rewrite the status with the outcome (the AdaptersReady condition)."""
    ctl: Controller = memo.controller
    key, owner = (namespace, name), plain(body)
    isvc = InferenceService.from_body(owner)
    try:
        api_key = ctl.api_key(isvc)
    except client.ApiException as error:
        logger.warning("cannot read the API key of %s/%s: %s", namespace, name, error.reason)
        return
    pods = list(kwargs["pod_index"].get(key, []))
    report = sync_adapters(isvc, pods, lambda url: PodAdapterAPI(url, api_key))
    with ctl.lock(key):
        if owner_of(ctl, kwargs["isvc_index"], key) is None:
            return  # deleted meanwhile
        ctl.adapter_reports[key] = report
    ctl.statuses.request(key, indexes_of(kwargs))


def _autoscales(spec: kopf.Spec, **_: Any) -> bool:
    return spec.get("autoscaling") is not None


@kopf.timer(*ISVC, interval=IDLE_CHECK_SECONDS, when=_autoscales)
def on_idle_timer(
    body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Scale to zero: an idle service (autoscaling.minReplicas 0) goes to 0 replicas, and
    while it has no ready pod its traffic goes to the activator (idle_scaler.py)."""
    ctl: Controller = memo.controller
    key = (namespace, name)
    to_zero = InferenceService.from_body(body).scales_to_zero
    samples = pod_samples(list(kwargs["pod_index"].get(key, []))) if to_zero else {}
    with ctl.lock(key):
        if owner_of(ctl, kwargs["isvc_index"], key) is None:
            return
        try:
            scaled = ctl.idle.check(plain(body), samples, time.monotonic())
        except client.ApiException as error:  # tried again at the next tick
            logger.warning("scale to zero of %s/%s: %s", *key, api_error_message(error))
            return
    if scaled:
        metrics.SCALED_TO_ZERO.inc()
        after = body["spec"]["autoscaling"].get("scaleToZeroAfterSeconds", 300)
        message = f"no request for {after} s: replicas 0 until the next request"
        kopf.event(body, type="Normal", reason="ScaledToZero", message=message)


def _routed_at_zero(spec: kopf.Spec, **_: Any) -> bool:
    autoscaling = spec.get("autoscaling") or {}
    return (
        bool((spec.get("router") or {}).get("enabled"))
        and autoscaling.get("minReplicas", 1) == 0
        and not spec.get("replicas")
    )


@kopf.timer(*ISVC, interval=PICKER_WAKE_SECONDS, when=_routed_at_zero)
def on_picker_wake_timer(
    body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Scale from zero through the pool: requests the endpoint picker holds for a service
    at zero set it to 1 replica (picker_wakeup.py). The scrape runs outside the lock."""
    ctl: Controller = memo.controller
    if owner_of(ctl, kwargs["isvc_index"], (namespace, name)) is None:
        return
    try:
        woken = wake_if_requests_wait(ctl.kube, plain(body))
    except client.ApiException as error:  # tried again at the next tick
        logger.warning("waking %s/%s: %s", namespace, name, api_error_message(error))
        return
    if woken:
        kopf.event(
            body,
            type="Normal",
            reason="ScaledFromZero",
            message="requests wait in the endpoint picker: replicas 1",
        )


@kopf.on.event("", "v1", "persistentvolumeclaims")
def on_claim_event(namespace: str, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """A claim appeared or went away: recheck the services that name it."""
    ctl: Controller = memo.controller
    for key in [k for k in kwargs["isvc_index"] if k[0] == namespace]:
        owner = owner_of(ctl, kwargs["isvc_index"], key)
        if owner is not None and _names_claim(owner, name):
            ctl.statuses.request(key, indexes_of(kwargs))


def _names_claim(body: dict[str, Any], claim: str) -> bool:
    return any(named == claim for _, named in InferenceService.from_body(body).claims)


def _wants_monitor(isvc: InferenceService) -> bool:
    return isvc.monitoring.service_monitor


def _wants_pod_monitor(isvc: InferenceService) -> bool:
    return isvc.monitoring.service_monitor and isvc.disaggregated


def _wants_router(isvc: InferenceService) -> bool:
    return isvc.router is not None


def _wants_groups(isvc: InferenceService) -> bool:
    return isvc.engine.multi_node


# CRDs of optional children: when one comes or goes, the services that want its kind are
# reconciled now (a ServiceMonitor, or a pool and picker), not at their next change.
OPTIONAL_APIS = {
    SERVICE_MONITOR_CRD: (MONITORING_API, "servicemonitors", _wants_monitor, "monitoring-api"),
    POD_MONITOR_CRD: (MONITORING_API, "podmonitors", _wants_pod_monitor, "monitoring-api"),
    c.INFERENCE_POOL_CRD: (c.INFERENCE_POOL_API, "inferencepools", _wants_router, "pool-api"),
    c.LWS_CRD: (c.LWS_API, c.LWS_PLURAL, _wants_groups, "lws-api"),
}


@kopf.on.event(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    when=lambda name, **_: name in OPTIONAL_APIS,
)
async def on_optional_api(
    body: kopf.Body,
    event: kopf.RawEvent,
    name: str,
    memo: kopf.Memo,
    isvc_index: kopf.Index,
    **_: Any,
) -> None:
    """An optional API's CRD came or went. Waiting for discovery to catch up happens on
    the event loop, not on a handler thread."""
    ctl: Controller = memo.controller
    api, plural, wants, trigger = OPTIONAL_APIS[name]
    ctl.kube.forget_served()
    if event.get("type") != "DELETED" and not _established(body):
        return  # a later event of this CRD says Established
    deadline = time.monotonic() + DISCOVERY_WAIT_SECONDS
    while time.monotonic() < deadline:
        if await asyncio.to_thread(ctl.kube.served, api, plural):
            break
        await asyncio.sleep(0.5)  # discovery follows Established closely, not at once
        ctl.kube.forget_served()
    await asyncio.to_thread(_reconcile_wanting, ctl, isvc_index, wants, trigger)


def _reconcile_wanting(ctl: Controller, isvc_index: kopf.Index, wants: Any, trigger: str) -> None:
    for key in list(isvc_index):
        owner = owner_of(ctl, isvc_index, key)
        if owner is None or not wants(InferenceService.from_body(owner)):
            continue
        find_owner = partial(owner_of, ctl, isvc_index, key)
        with ctl.lock(key):  # the children's events that follow rewrite the status
            RetriedReconcile(ctl, key, find_owner, trigger).run(owner)


def _established(crd: kopf.Body) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
