"""One active operator among its replicas: a coordination.k8s.io/v1 Lease.

A replica starts as a standby: it tries every ``retry_seconds`` to take the Lease, which
it may when nobody holds it or when the holder's record has not changed for
``lease_seconds`` as this replica watched it (its own clock: skew between nodes does not
matter). The holder starts kopf, whose start-up resumes every InferenceService, so what
changed while nobody led is reconciled, and renews every ``renew_seconds``. A holder that
finds the Lease taken, or cannot renew for ``lease_seconds``, stops (its process exits
and comes back as a standby); one that stops on SIGTERM gives the Lease up first, so a
standby takes over at its next try instead of after the lease time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from octavo_operator.kube import Kube, object_path

logger = logging.getLogger(__name__)
LEASE_API = "coordination.k8s.io/v1"


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str = "octavo-operator"
    identity: str = field(default_factory=default_identity)
    lease_seconds: float = 10.0
    renew_seconds: float = 2.0
    retry_seconds: float = 1.0


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderLease:
    def __init__(self, kube: Kube, settings: LeaseSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.kube, self.settings, self.clock = kube, settings, clock
        self.path = object_path(LEASE_API, "Lease", settings.namespace, settings.name)
        self._seen: tuple[Any, Any] | None = None  # (holder, renewTime) last observed
        self._seen_at = 0.0

    def try_acquire(self) -> bool:
        """Take or renew the Lease; False while someone else validly holds it."""
        lease = self._read()
        if lease is None:
            return self._create()
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder == self.settings.identity:
            return self._write(lease, taking=False)
        record = (holder, spec.get("renewTime"))
        if record != self._seen:
            self._seen, self._seen_at = record, self.clock()
        if holder and self.clock() - self._seen_at < self.settings.lease_seconds:
            return False
        logger.info("taking the lease %s from %r", self.settings.name, holder)
        return self._write(lease, taking=True)

    def release(self) -> None:
        """Give the Lease up (best effort) so a standby need not wait for it to expire."""
        try:
            lease = self._read()
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.settings.identity:
                lease["spec"]["holderIdentity"] = None
                self.kube.call("PUT", self.path, lease)
        except client.ApiException as error:
            logger.warning("could not release the lease: %s", error.reason)

    def _read(self) -> dict[str, Any] | None:
        try:
            return self.kube.call("GET", self.path)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def _create(self) -> bool:
        body = {"apiVersion": LEASE_API, "kind": "Lease",
                "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
                "spec": self._spec(None, taking=True)}  # fmt: skip
        return self._send("POST", self.path.rsplit("/", 1)[0], body)

    def _write(self, lease: dict[str, Any], taking: bool) -> bool:
        lease["spec"] = self._spec(lease.get("spec") or {}, taking)
        return self._send("PUT", self.path, lease)  # resourceVersion: optimistic locking

    def _spec(self, old: dict[str, Any] | None, taking: bool) -> dict[str, Any]:
        spec = dict(old or {})
        now = _now_micro()
        spec.update(holderIdentity=self.settings.identity, renewTime=now,
                    leaseDurationSeconds=int(self.settings.lease_seconds))  # fmt: skip
        if taking:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (old is not None)
        return spec

    def _send(self, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            self.kube.call(method, path, body)
        except client.ApiException as error:
            if error.status == 409:  # someone else wrote it first
                return False
            raise
        return True


def wait_to_lead(lease: LeaderLease, stop: threading.Event) -> bool:
    """Block until this replica holds the Lease (True) or ``stop`` is set (False)."""
    logger.info("standing by for the lease %s as %s", lease.settings.name,
                lease.settings.identity)  # fmt: skip
    while not stop.is_set():
        try:
            if lease.try_acquire():
                logger.info("leading as %s", lease.settings.identity)
                return True
        except client.ApiException as error:
            logger.warning("lease %s: %s", lease.settings.name, error.reason)
        stop.wait(lease.settings.retry_seconds)
    return False


def keep_leading(lease: LeaderLease, stop: threading.Event, on_lost: Callable[[], None]) -> None:
    """Renew until ``stop``; call ``on_lost`` once the Lease is someone else's or could
    not be renewed for the lease time."""
    renewed = lease.clock()
    while not stop.wait(lease.settings.renew_seconds):
        try:
            if lease.try_acquire():
                renewed = lease.clock()
                continue
            logger.error("the lease %s was taken over", lease.settings.name)
        except client.ApiException as error:
            logger.warning("renewing the lease failed: %s", error.reason)
            if lease.clock() - renewed < lease.settings.lease_seconds:
                continue
            logger.error("could not renew the lease for %.0f s", lease.settings.lease_seconds)
        on_lost()
        return
