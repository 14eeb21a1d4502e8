"""One active operator among its replicas: a coordination.k8s.io/v1 Lease.

The timings are client-go's (kube-controller-manager's defaults): a 15 s lease, a 10 s
renew deadline, a 2 s retry period. A replica starts as a standby: every retry period it
tries to take the Lease, which it may when nobody holds it or when the holder's record has
not changed for the lease time (the longer of its own and the record's
leaseDurationSeconds) as this replica watched it, on its own clock: skew between nodes does
not matter. The holder starts kopf, whose start-up resumes every InferenceService, so what
changed while nobody led is reconciled, and tries to renew every retry period.

The holder leads only while its last successful renewal *started* less than the renew
deadline ago (``LeaderLease.leads``, read on its own clock at every instant, so a process
that was paused — SIGSTOP, a long GC, a frozen VM — knows at once on waking that it no
longer leads, before any of its threads catches up). A standby can take the Lease only a
full lease time after it saw that renewal written, which is later than it started: the
holder stops believing it leads at least ``lease - renew deadline`` (5 s) before anyone else
may start. When the deadline passes, ``Leadership`` reports the loss (kopf stops, the
process exits and comes back as a standby) and writes through ``Kube`` are refused from
that instant. One that stops on SIGTERM gives the Lease up first, so a standby takes over
at its next try instead of after the lease time.
"""

from __future__ import annotations

import argparse
import logging
import math
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
LEASE_LOST_EXIT_CODE = 3  # the process exits with it when it lost the Lease (runner.py)


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class MonotonicClock:
    """The clock a lease is judged by: seconds that keep counting while the process is
    paused (CLOCK_MONOTONIC), and waits on it."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait SECONDS or until STOP is set; True if it was set."""
        return stop.wait(max(seconds, 0.0))


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str = "octavo-operator"
    identity: str = field(default_factory=default_identity)
    lease_seconds: float = 15.0  # client-go LeaseDuration
    renew_deadline_seconds: float = 10.0  # client-go RenewDeadline
    retry_seconds: float = 2.0  # client-go RetryPeriod

    def __post_init__(self) -> None:
        if not self.lease_seconds > self.renew_deadline_seconds > self.retry_seconds > 0:
            raise ValueError(
                "leader election needs lease > renew deadline > retry period > 0 (client-go's "
                f"defaults: 15 > 10 > 2), got {self.lease_seconds:g}, "
                f"{self.renew_deadline_seconds:g} and {self.retry_seconds:g} s"
            )


def lease_settings(args: argparse.Namespace) -> LeaseSettings:
    """The settings of octavo-operator's --leader-elect-* flags (ValueError if unusable)."""
    return LeaseSettings(
        namespace=args.leader_election_namespace,
        lease_seconds=args.leader_elect_lease_duration,
        renew_deadline_seconds=args.leader_elect_renew_deadline,
        retry_seconds=args.leader_elect_retry_period,
    )


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderLease:
    def __init__(self, kube: Kube, settings: LeaseSettings, clock: Any = None) -> None:
        self.kube, self.settings = kube, settings
        self.clock = clock or MonotonicClock()
        self.path = object_path(LEASE_API, "Lease", settings.namespace, settings.name)
        self._seen: tuple[Any, Any] | None = None  # (holder, renewTime) last observed
        self._seen_at = 0.0
        self._renewed_at: float | None = None  # when the last successful write started

    @property
    def valid_until(self) -> float:
        """Until when (on the clock) this replica leads; -inf when it does not."""
        if self._renewed_at is None:
            return -math.inf
        return self._renewed_at + self.settings.renew_deadline_seconds

    def leads(self) -> bool:
        return self.clock.now() < self.valid_until

    def try_acquire(self) -> bool:
        """Take or renew the Lease; False while someone else validly holds it."""
        attempt = self.clock.now()
        lease = self._read()
        if lease is None:
            return self._succeeded(attempt, self._create())
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder == self.settings.identity:
            return self._succeeded(attempt, self._write(lease, taking=False))
        self._mark_renewed(None)  # someone else's (or free): not ours any more
        record = (holder, spec.get("renewTime"))
        if record != self._seen:
            self._seen, self._seen_at = record, self.clock.now()
        if holder and self.clock.now() - self._seen_at < self._lease_time(spec):
            return False
        logger.info("taking the lease %s from %r", self.settings.name, holder)
        return self._succeeded(attempt, self._write(lease, taking=True))

    def release(self) -> None:
        """Give the Lease up (best effort) so a standby need not wait for it to expire."""
        self._mark_renewed(None)
        try:
            lease = self._read()
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.settings.identity:
                lease["spec"]["holderIdentity"] = None
                self.kube.call("PUT", self.path, lease, timeout=self._timeout())
        except client.ApiException as error:
            logger.warning("could not release the lease: %s", error.reason)

    def _lease_time(self, spec: dict[str, Any]) -> float:
        """How long a record stands: the holder's promise or ours, whichever is longer."""
        promised = spec.get("leaseDurationSeconds")
        return max(float(promised or 0), self.settings.lease_seconds)

    def _succeeded(self, attempt: float, written: bool) -> bool:
        if written:
            self._mark_renewed(attempt)
        return written

    def _mark_renewed(self, at: float | None) -> None:
        self._renewed_at = at

    def _timeout(self) -> float:
        """A request may not outlast the renew deadline (nor the leadership it renews)."""
        deadline = self.settings.renew_deadline_seconds
        if not self.leads():
            return deadline
        return max(1.0, min(deadline, self.valid_until - self.clock.now()))

    def _read(self) -> dict[str, Any] | None:
        try:
            return self.kube.call("GET", self.path, timeout=self._timeout())
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def _create(self) -> bool:
        body = {
            "apiVersion": LEASE_API,
            "kind": "Lease",
            "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
            "spec": self._spec(None, taking=True),
        }
        return self._send("POST", self.path.rsplit("/", 1)[0], body)

    def _write(self, lease: dict[str, Any], taking: bool) -> bool:
        lease["spec"] = self._spec(lease.get("spec") or {}, taking)
        return self._send("PUT", self.path, lease)  # resourceVersion: optimistic locking

    def _spec(self, old: dict[str, Any] | None, taking: bool) -> dict[str, Any]:
        spec = dict(old or {})
        now = _now_micro()
        spec.update(
            holderIdentity=self.settings.identity,
            renewTime=now,
            leaseDurationSeconds=math.ceil(self.settings.lease_seconds),
        )
        if taking:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (old is not None)
        return spec

    def _send(self, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            self.kube.call(method, path, body, timeout=self._timeout())
        except client.ApiException as error:
            if error.status == 409:  # someone else wrote it first
                return False
            raise
        return True


def wait_to_lead(lease: LeaderLease, stop: threading.Event) -> bool:
    """Block until this replica holds the Lease (True) or ``stop`` is set (False)."""
    logger.info("standing by for the lease %s as %s", lease.settings.name, lease.settings.identity)
    while not stop.is_set():
        try:
            if lease.try_acquire():
                logger.info("leading as %s", lease.settings.identity)
                return True
        except client.ApiException as error:
            logger.warning("lease %s: %s", lease.settings.name, error.reason)
        if lease.clock.wait(stop, lease.settings.retry_seconds):
            break
    return False


def keep_leading(lease: LeaderLease, stop: threading.Event, on_lost: Callable[[], None]) -> None:
    """Renew every retry period until ``stop``; call ``on_lost`` once the Lease is someone
    else's or the renew deadline passed without a successful renewal."""
    while not lease.clock.wait(stop, lease.settings.retry_seconds):
        if not lease.leads():
            deadline = lease.settings.renew_deadline_seconds
            logger.error("no renewal of the lease %s within %g s", lease.settings.name, deadline)
            break
        try:
            if lease.try_acquire():
                continue
            logger.error("the lease %s was taken over", lease.settings.name)
            break
        except client.ApiException as error:
            logger.warning("renewing the lease failed: %s", error.reason)
    else:
        return
    on_lost()


def watch_deadline(lease: LeaderLease, stop: threading.Event, on_lost: Callable[[], None]) -> None:
    """Call ``on_lost`` the moment the renew deadline passes, even while a renewal hangs."""
    while True:
        left = lease.valid_until - lease.clock.now()
        if left <= 0:
            on_lost()
            return
        if lease.clock.wait(stop, left):
            return


class Leadership:
    """This replica's hold on the Lease once it leads: renewal and deadline threads, the
    ``lost`` event (kopf's stop flag) and ``leads`` (the gate of every write)."""

    def __init__(self, lease: LeaderLease, on_lost: Callable[[], None] = lambda: None) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self._on_lost, self._done = on_lost, threading.Event()
        self._report = threading.Lock()

    def leads(self) -> bool:
        return not self.lost.is_set() and self.lease.leads()

    def start(self) -> None:
        for run in (keep_leading, watch_deadline):
            name = f"lease-{run.__name__}"
            args = (self.lease, self._done, self._lose)
            threading.Thread(target=run, args=args, name=name, daemon=True).start()

    def stop(self) -> None:
        """Stop renewing; give the Lease up unless it was lost."""
        self._done.set()
        if not self.lost.is_set():
            self.lease.release()

    def _lose(self) -> None:
        with self._report:
            if self.lost.is_set() or self._done.is_set():
                return  # reported already, or stopped on purpose
            self.lost.set()
        self._on_lost()
