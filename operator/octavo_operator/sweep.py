"""The operator's memory checked against the API server, as an informer's resync.

kopf can miss a service's DELETED event: it drops the events of an object that arrive
while it throttles that object after an unexpected error (an API timeout while patching
it, under load), and a watch restarted from a fresh list reports nothing about what was
deleted meanwhile. The service then stays in kopf's index and in the Controller: its
timers, status writes and drift checks go on, and a child the garbage collector deletes is
"put back" for an owner that no longer exists. Every SWEEP_SECONDS the sweeper lists the
services of each namespace it keeps state for (metadata only) and forgets each one the
list lacks, as its DELETED event would have; the Controller then refuses that uid
(Controller.gone) wherever kopf's index still offers it.

A child's event can be lost the same way: a child someone else changed then stayed changed
until the service's next reconcile. Every CHILD_SWEEP_SECONDS the sweeper also lists the
children of those namespaces (one list per kind, by the operator's label) and hands each
child that reads as drifted, or missing, to the same drift check a watch event gets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from octavo_operator import constants as c
from octavo_operator import metrics
from octavo_operator.reconcile import Applied, Controller, Key, child_identity

logger = logging.getLogger(__name__)
SWEEP_SECONDS = 10.0
CHILD_SWEEP_SECONDS = 60.0
# Names and uids only: a list of PartialObjectMetadata, not the services' specs and status.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
ChildResource = tuple[str, str, str]  # (group, version, plural), as kopf names it
DriftCheck = Callable[[Key, dict[str, Any], bool], None]  # key, child, deleted


@dataclass
class Sweeper:
    ctl: Controller
    child_resources: tuple[ChildResource, ...] = ()
    check_child: DriftCheck | None = None  # e.g. submits handlers.correct_drift_when_free
    interval: float = SWEEP_SECONDS
    child_interval: float = CHILD_SWEEP_SECONDS

    def start(self) -> None:
        threading.Thread(target=self._loop, name="sweep", daemon=True).start()

    def _loop(self) -> None:
        children_due = time.monotonic() + self.child_interval
        while True:
            time.sleep(self.interval)
            try:
                self.sweep()
                if time.monotonic() >= children_due:
                    children_due = time.monotonic() + self.child_interval
                    self.sweep_children()
            except Exception:  # the API server is unreachable, say: the next sweep tries again
                logger.exception("checking the tracked services against the API server failed")

    def sweep(self) -> list[Key]:
        """Forget each tracked service its namespace's list lacks; the keys forgotten."""
        tracked = {key: applied.uid for key, applied in list(self.ctl.applied.items())}
        forgotten = []
        for namespace in sorted({namespace for namespace, _ in tracked}):
            listed_after = time.monotonic()
            present = self.listed_uids(namespace)
            missing = [
                (key, uid)
                for key, uid in tracked.items()
                if key[0] == namespace and uid not in present
            ]
            forgotten += self._forget(missing, listed_after)
        return forgotten

    def listed_uids(self, namespace: str) -> set[str]:
        path = f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{namespace}/{c.PLURAL}"
        listed = self.ctl.kube.call("GET", path, Accept=METADATA_ONLY)
        return {item["metadata"]["uid"] for item in listed.get("items") or []}

    def _forget(self, missing: Iterable[tuple[Key, str]], listed_after: float) -> list[Key]:
        forgotten = []
        for key, uid in missing:
            if self.ctl.forget_gone(key, uid, listed_after):
                logger.warning(
                    "InferenceService %s/%s (uid %s) is gone from the API server, its "
                    "deletion unseen: forgotten",
                    *key,
                    uid,
                )
                metrics.SWEPT_SERVICES.inc()
                forgotten.append(key)
        return forgotten

    def sweep_children(self) -> list[tuple[Key, str, str]]:
        """Hand every drifted or missing child of a settled service to check_child; the
        (key, kind, name) of each one handed over."""
        tracked = list(self.ctl.applied.items())
        handed = []
        for namespace in sorted({key[0] for key, _ in tracked}):
            listed_after = time.monotonic()
            listed, kinds = self.listed_children(namespace)
            for key, applied in tracked:
                if key[0] == namespace and self._settled(key, applied, listed_after):
                    handed += self._check(key, applied, listed, kinds)
        return handed

    def _settled(self, key: Key, applied: Applied, listed_after: float) -> bool:
        """Reconciled (without error) before the lists were asked for, and not since."""
        return (
            applied.error is None
            and applied.finished < listed_after
            and self.ctl.applied.get(key) is applied
        )

    def listed_children(self, namespace: str) -> tuple[dict[tuple[str, str], Any], set[str]]:
        """The operator's children in NAMESPACE by (kind, name), and the kinds listed."""
        listed: dict[tuple[str, str], Any] = {}
        kinds = set()
        label = f"{c.MANAGED_BY_LABEL}={c.MANAGED_BY}"
        for group, version, plural in self.child_resources:
            api_version = f"{group}/{version}" if group else version
            if group and not self.ctl.kube.served(api_version, plural):
                continue
            prefix = f"/apis/{api_version}" if group else f"/api/{version}"
            path = f"{prefix}/namespaces/{namespace}/{plural}"
            answer = self.ctl.kube.call("GET", path, query=[("labelSelector", label)])
            kind = str(answer.get("kind", "")).removesuffix("List")
            kinds.add(kind)
            for item in answer.get("items") or []:
                listed[(kind, item["metadata"]["name"])] = {**item, "kind": kind}
        return listed, kinds

    def _check(
        self, key: Key, applied: Applied, listed: dict[tuple[str, str], Any], kinds: set[str]
    ) -> list[tuple[Key, str, str]]:
        handed = []
        for kind, name in list(applied.versions):
            if kind not in kinds:
                continue  # a kind not listed (the node key's Secret)
            found = listed.get((kind, name))
            child = child_identity(found) if found else {"kind": kind, "metadata": {"name": name}}
            if self.ctl.drifted(key, child, deleted=found is None):
                self._hand_over(key, child, deleted=found is None)
                handed.append((key, kind, name))
        return handed

    def _hand_over(self, key: Key, child: dict[str, Any], deleted: bool) -> None:
        """check_child, in a copy of a kopf handler's context where one ran already."""
        if self.check_child is None:
            return
        context = self.ctl.kopf_context
        run = context.copy().run if context is not None else _call
        run(self.check_child, key, child, deleted)


def _call(function: Callable[..., None], *args: Any) -> None:
    function(*args)
