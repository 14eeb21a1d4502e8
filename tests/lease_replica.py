"""Leader election under test: an in-memory Lease API, clocks the test controls, and an
operator replica run as a real process (to be paused with SIGSTOP) that leads through
`octavo_operator.leader` and "acts" (as a reconcile would write) whenever it may.

The Lease store lives in a multiprocessing manager's process, so the test and the replica
process share it; the clock is a shared double the test moves by hand.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from multiprocessing.managers import BaseManager
from typing import Any

from kubernetes import client

from octavo_operator.leader import (
    LEASE_LOST_EXIT_CODE,
    LeaderLease,
    Leadership,
    LeaseSettings,
    wait_to_lead,
)

NAMESPACE = "ops"
POLL_SECONDS = 0.002  # how often a waiting replica looks at the shared clock (real time)


class LeaseStore:
    """GET/POST/PUT of one Lease, with optimistic concurrency as the apiserver does it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.failing = False  # answer every call with a 500

    def call(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        if self.failing:
            raise client.ApiException(status=500, reason="apiserver down")
        if method == "GET":
            if self.lease is None:
                raise client.ApiException(status=404)
            return json.loads(json.dumps(self.lease))
        if method == "POST" and self.lease is not None:
            raise client.ApiException(status=409)
        if method == "PUT" and body["metadata"].get("resourceVersion") != str(self.version):
            raise client.ApiException(status=409)
        self.version += 1
        self.lease = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": str(self.version)},
        }
        return self.lease

    def holder(self) -> str | None:
        return None if self.lease is None else self.lease["spec"].get("holderIdentity")


class VirtualClock:
    """Time that moves only when told to; a wait moves it (one thread)."""

    def __init__(self) -> None:
        self.value = 0.0

    def now(self) -> float:
        return self.value

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        if not stop.is_set():
            self.value += seconds
        return stop.is_set()


class SharedClock:
    """A clock in shared memory that the test moves; a wait polls it (real time)."""

    def __init__(self, value: Any) -> None:
        self.value = value  # a multiprocessing RawValue("d"): no lock a paused process holds

    def now(self) -> float:
        return self.value.value

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        end = self.now() + seconds
        while self.now() < end:
            if stop.wait(POLL_SECONDS):
                return True
        return stop.is_set()


_STORE: LeaseStore | None = None


def _the_store() -> LeaseStore:
    """The one store of the manager's process."""
    global _STORE
    if _STORE is None:
        _STORE = LeaseStore()
    return _STORE


class StoreManager(BaseManager):
    pass


StoreManager.register("store", callable=_the_store, exposed=("call", "holder"))


class PublishingLease(LeaderLease):
    """A LeaderLease that publishes until when it leads, before it believes it, so the
    test reads that belief while the process is paused."""

    def __init__(self, kube: Any, settings: LeaseSettings, clock: Any, valid_until: Any) -> None:
        super().__init__(kube, settings, clock)
        self.published = valid_until

    def _mark_renewed(self, at: float | None) -> None:
        if at is not None:
            until = at + self.settings.renew_deadline_seconds
            self.published.value = max(self.published.value, until)
        super()._mark_renewed(at)


def lead_and_act(
    address: Any, authkey: bytes, clock: Any, valid_until: Any, last_action: Any
) -> None:
    """The replica process: take the Lease, then act whenever Leadership.leads() says so
    (recording the clock of its last act), until the loss is reported; exit as the
    operator does when it lost the Lease."""
    manager = StoreManager(address=address, authkey=authkey)
    manager.connect()
    lease = PublishingLease(
        manager.store(),
        LeaseSettings(NAMESPACE, identity="paused"),
        SharedClock(clock),
        valid_until,
    )
    if not wait_to_lead(lease, threading.Event()):
        sys.exit(1)
    leadership = Leadership(lease)
    leadership.start()
    while not leadership.lost.is_set():
        if leadership.leads():
            last_action.value = clock.value
        time.sleep(POLL_SECONDS)
    sys.exit(LEASE_LOST_EXIT_CODE)
