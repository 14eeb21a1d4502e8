"""Reconcile one InferenceService: apply its children, remove the ones turned off, and
write its status. Thread-safe; kopf calls it from its worker threads."""

from __future__ import annotations

import base64
import contextvars
import copy
import hashlib
import json
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client

from octavo_operator import constants as c
from octavo_operator import metrics
from octavo_operator.adapter_sync import AdapterReport
from octavo_operator.api.service import InferenceService
from octavo_operator.builders.activator_slice import ActivatorAddress
from octavo_operator.builders.children import DesiredChildren, desired_children
from octavo_operator.conditions import merge, transitions
from octavo_operator.events import now_rfc3339, post_transitions
from octavo_operator.idle_scaler import IdleScaler
from octavo_operator.kube import Kube, error_text, object_path
from octavo_operator.memory import Trimmer
from octavo_operator.node_key import ensure_node_key
from octavo_operator.prefill_names import prefill_name_conflict
from octavo_operator.status import Observed, compute, deployment_summary

logger = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)
# API errors that a retry with the same spec cannot fix: reported, not retried.
PERMANENT_STATUSES = (400, 404, 422)


class TransientError(RuntimeError):
    """An apply failed in a way a later retry may fix (5xx, timeouts, 403 until RBAC is fixed)."""


@dataclass
class Applied:
    """What the last reconcile of one InferenceService did."""

    generation: int | None = None
    error: str | None = None
    # (kind, name) -> generation or resourceVersion the apply returned: a child event with
    # another value means someone else changed the child.
    versions: dict[tuple[str, str], str] = field(default_factory=dict)
    deployment: dict[str, Any] | None = None
    picker: dict[str, Any] | None = None  # the endpoint picker's Deployment (spec.router)
    prefill: dict[str, Any] | None = None  # the prefill pool's Deployment (spec.prefill)
    pools_served: bool | None = None  # whether the InferencePool API was there
    lws_served: bool | None = None  # whether the LeaderWorkerSet API was there
    prefill_conflict: str | None = None  # spec.prefill's names belong to another owner
    uid: str = ""  # the service's metadata.uid (a namesake created later has another)
    started: float = field(default_factory=time.monotonic)  # when this reconcile began
    finished: float = 0.0  # when it recorded what it applied (time.monotonic)


@dataclass(frozen=True)
class Settings:
    default_image: str = c.DEFAULT_SERVER_IMAGE
    activator: ActivatorAddress | None = None  # where services at zero send their traffic
    picker_image: str = c.DEFAULT_PICKER_IMAGE  # spec.router's endpoint picker
    sidecar_image: str = c.DEFAULT_SIDECAR_IMAGE  # spec.prefill's routing sidecar


# What someone else may change in a child without a generation (Services, ConfigMaps,
# claims, HorizontalPodAutoscalers, RBAC objects): its status changes often and is nobody's
# drift.
DESIRED_FIELDS = ("spec", "data", "binaryData", "rules", "subjects", "roleRef")


def is_workload(isvc: InferenceService, obj: dict[str, Any]) -> bool:
    """The server pods' Deployment, or the LeaderWorkerSet of a multi-node service."""
    name = obj["metadata"]["name"]
    return (obj["kind"], name) in (("Deployment", isvc.name), (c.LWS_KIND, isvc.group_name))


def child_version(obj: dict[str, Any]) -> str:
    """metadata.generation where the API keeps one, else a digest of the desired fields."""
    generation = (obj.get("metadata") or {}).get("generation")
    if generation:
        return f"g{generation}"
    desired = json.dumps({k: obj.get(k) for k in DESIRED_FIELDS}, sort_keys=True, default=str)
    return "h" + hashlib.blake2b(desired.encode(), digest_size=12).hexdigest()


def child_identity(body: Any) -> dict[str, Any]:
    """What a drift check reads of a child: its kind, name and generation, or its desired
    fields where it has no generation (reconcile.child_version)."""
    meta = body.get("metadata") or {}
    keep = ("name", "namespace", "generation", "resourceVersion")
    identity = {"kind": body.get("kind"), "metadata": {k: meta.get(k) for k in keep}}
    if not meta.get("generation"):
        identity.update(copy.deepcopy({k: body.get(k) for k in DESIRED_FIELDS}))
    return identity


class Controller:
    def __init__(self, kube: Kube, settings: Settings):
        self.kube = kube
        self.settings = settings
        self.applied: dict[Key, Applied] = {}
        self.adapter_reports: dict[Key, AdapterReport] = {}
        self.written: dict[Key, dict[str, Any]] = {}  # the last status this process wrote
        self.statuses: Any = None  # the StatusQueue, set at start-up (handlers.configure)
        self.drift_checks: Any = None  # a small executor, set at start-up as well
        self.idle = IdleScaler(kube, settings.activator)
        # Services the API server no longer has, though kopf's index still holds them (their
        # DELETED event was lost: sweep.py): key -> uid. Nothing is done for them any more.
        self.gone: dict[Key, str] = {}
        self.trimmer = Trimmer()
        # A kopf handler's context (its Event queue, for the status writes and Events that
        # follow): work started off kopf's own threads (sweep.py) runs in a copy of it.
        self.kopf_context: contextvars.Context | None = None
        self._locks: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)

    def lock(self, key: Key) -> threading.Lock:
        return self._locks[key]

    def forget(self, key: Key) -> None:
        """Drop what is kept about a deleted InferenceService (memory stays bounded). Taken
        under the service's lock: a reconcile or status write in flight finishes first, and
        the ones after it find the service gone from kopf's index and record nothing."""
        with self.lock(key):
            self._drop(key)
            self.gone.pop(key, None)
        self.trimmer.request()

    def forget_gone(self, key: Key, uid: str, listed_after: float) -> bool:
        """Forget KEY if what is kept of it is still about UID and older than the list that
        lacked it (taken at LISTED_AFTER), and refuse UID from now on; True if forgotten."""
        with self.lock(key):
            applied = self.applied.get(key)
            if applied is None or applied.uid != uid or applied.started >= listed_after:
                return False
            self._drop(key)
            self.gone[key] = uid
        self.trimmer.request()
        return True

    def _drop(self, key: Key) -> None:
        """(The caller holds the service's lock.)"""
        self.applied.pop(key, None)
        self.adapter_reports.pop(key, None)
        self.written.pop(key, None)
        self.idle.forget(key)
        self._locks.pop(key, None)
        self._count_tracked()

    def is_gone(self, owner: dict[str, Any]) -> bool:
        meta = owner.get("metadata") or {}
        return self.gone.get((meta.get("namespace"), meta.get("name"))) == meta.get("uid")

    def _count_tracked(self) -> None:
        metrics.TRACKED_SERVICES.set(len(self.applied))

    def api_key(self, isvc: InferenceService) -> str | None:
        """The key of spec.apiKeySecretRef (to call the pods' adapter routes); None without."""
        if isvc.api_key is None:
            return None
        path = object_path("v1", "Secret", isvc.namespace, isvc.api_key.name)
        data = (self.kube.call("GET", path).get("data") or {}).get(isvc.api_key.key)
        return base64.b64decode(data).decode() if data else None

    def reconcile(self, body: dict[str, Any], trigger: str) -> Applied:
        """Apply every child; raises TransientError when a retry may help."""
        isvc = InferenceService.from_body(body)
        started = time.perf_counter()
        applied = Applied(generation=isvc.generation, uid=isvc.uid)
        self.gone.pop((isvc.namespace, isvc.name), None)  # a namesake of a lost service
        try:
            self._apply_children(isvc, applied, check_all=trigger == "resume")
        except client.ApiException as error:
            applied.error = error_text(error)
            applied.generation = self.applied.get((isvc.namespace, isvc.name), Applied()).generation
            result = "permanent_error" if error.status in PERMANENT_STATUSES else "error"
            metrics.RECONCILES.labels(trigger, result).inc()
            self._record(isvc, applied)
            if result == "error":
                raise TransientError(applied.error) from error
            return applied
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
        metrics.RECONCILES.labels(trigger, "ok").inc()
        self._record(isvc, applied)
        return applied

    def _record(self, isvc: InferenceService, applied: Applied) -> None:
        applied.finished = time.monotonic()
        self.applied[(isvc.namespace, isvc.name)] = applied
        self._count_tracked()

    def _apply_children(self, isvc: InferenceService, applied: Applied, check_all: bool) -> None:
        """Apply the wanted children; delete optional ones turned off. Deletes are only sent
        for kinds this process applied before, or for every kind on resume (the spec may
        have changed while the operator was down), and only to objects this service controls
        (a namesake of another owner stays)."""
        isvc, children = self._desired(isvc, applied)
        previous = self.applied.get((isvc.namespace, isvc.name), Applied()).versions
        if isvc.engine.multi_node and applied.lws_served:  # before the pods, which read it
            ensure_node_key(self.kube, isvc)
            applied.versions[("Secret", isvc.node_key_secret_name)] = "created"
        for obj in children.apply:
            result = self.kube.apply(obj)
            name = obj["metadata"]["name"]
            applied.versions[(obj["kind"], name)] = child_version(result)
            if is_workload(isvc, obj):
                applied.deployment = deployment_summary(result)  # not the whole object
            elif obj["kind"] == "Deployment" and name == isvc.prefill_name:
                applied.prefill = deployment_summary(result)
            elif obj["kind"] == "Deployment":
                applied.picker = deployment_summary(result)
        for ref in children.removals:
            if not check_all and (ref.kind, ref.name) not in previous:
                continue
            if self.kube.delete(ref.api_version, ref.kind, isvc.namespace, ref.name, isvc.uid):
                logger.info(
                    "deleted %s %s/%s (off in the spec)", ref.kind, isvc.namespace, ref.name
                )

    def _desired(
        self, isvc: InferenceService, applied: Applied
    ) -> tuple[InferenceService, DesiredChildren]:
        """The children for the spec and the APIs the cluster serves (recorded in APPLIED).
        A spec.prefill whose names another owner holds is served as an invalid one: the
        service as it is then built comes back with the children."""
        monitors = self.kube.served("monitoring.coreos.com/v1", "servicemonitors")
        pod_monitors = monitors and self.kube.served("monitoring.coreos.com/v1", "podmonitors")
        applied.pools_served = self.kube.served(c.INFERENCE_POOL_API, "inferencepools")
        applied.lws_served = self.kube.served(c.LWS_API, c.LWS_PLURAL)
        applied.prefill_conflict = prefill_name_conflict(self.kube, isvc)
        if applied.prefill_conflict is not None:
            isvc = replace(isvc, prefill_problem=applied.prefill_conflict)
        children = desired_children(
            isvc,
            self.settings.default_image,
            monitors,
            inference_pools_served=applied.pools_served,
            picker_image=self.settings.picker_image,
            leader_worker_sets_served=bool(applied.lws_served),
            sidecar_image=self.settings.sidecar_image,
            pod_monitors_served=pod_monitors,
        )
        return isvc, children

    def drifted(self, key: Key, child: dict[str, Any], deleted: bool) -> bool:
        """Did someone else delete or change this child since our last apply?"""
        applied = self.applied.get(key)
        if applied is None or applied.error is not None:
            return False  # not reconciled by this process yet: resume/create will do it
        kind, name = child.get("kind", ""), (child.get("metadata") or {}).get("name", "")
        recorded = applied.versions.get((kind, name))
        if recorded is None:
            return False
        return deleted or recorded != child_version(child)

    def write_status(
        self, body: dict[str, Any], observed: Observed, *, post_events: bool = True
    ) -> bool:
        """Patch the status if it changed; post an Event per condition transition."""
        isvc = InferenceService.from_body(body)
        key = (isvc.namespace, isvc.name)
        fields, conds = compute(isvc, observed)
        # The body may predate our last write (its watch event not yet seen): compare
        # with what we wrote, so an unchanged status is never patched twice.
        old_status = self.written.get(key) or body.get("status") or {}
        old_conditions = old_status.get("conditions") or []
        generation = observed.applied_generation or isvc.generation
        new_status = {
            **fields,
            "conditions": merge(old_conditions, conds, generation, now_rfc3339()),
        }
        for optional in ("router", "prefill"):  # turned off: the merge patch drops it
            if optional not in fields and old_status.get(optional) is not None:
                new_status[optional] = None
        if _same_status(old_status, new_status):
            return False
        path = object_path(c.API_VERSION, c.KIND, isvc.namespace, isvc.name) + "/status"
        try:
            self.kube.merge_patch(path, {"status": new_status})
        except client.ApiException as error:
            if error.status == 404:  # deleted meanwhile
                return False
            raise
        metrics.STATUS_UPDATES.inc()
        self.written[key] = new_status
        body["status"] = new_status
        changed = transitions(old_conditions, conds) if post_events else []
        # kopf posts Events from one queue and retries a refused one for ~54 s: a namespace
        # being deleted refuses every Event, and would hold up those of every other one
        if changed and not self.kube.namespace_terminating(isvc.namespace):
            post_transitions(body, changed)
        return True


def _same_status(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return all(old.get(k) == v for k, v in new.items())
