"""Leader election over a Lease (against an in-memory stand-in of the Lease API with
resourceVersion checks), the standby's /healthz, and coalesced status writes."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from typing import Any

from kubernetes import client

from octavo_operator.leader import LeaderLease, LeaseSettings, keep_leading
from octavo_operator.standby import StandbyHealth
from octavo_operator.status_queue import StatusQueue


class LeaseStore:
    """GET/POST/PUT of one Lease, with optimistic concurrency as the apiserver does it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def call(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replica(store: LeaseStore, clock: Clock, name: str) -> LeaderLease:
    return LeaderLease(store, LeaseSettings("ops", identity=name, lease_seconds=10), clock)  # type: ignore[arg-type]


def test_one_leader_and_a_takeover_only_after_the_lease_time():
    store, clock = LeaseStore(), Clock()
    first, second = replica(store, clock, "a"), replica(store, clock, "b")
    assert first.try_acquire() and not second.try_acquire()
    clock.now = 5
    assert first.try_acquire(), "the holder renews"
    assert not second.try_acquire(), "a renewed lease is not free"
    clock.now = 14  # 9 s since b last saw the record change
    assert not second.try_acquire()
    clock.now = 16  # a stopped renewing at t=5: 11 s unchanged
    assert second.try_acquire()
    assert store.lease["spec"]["holderIdentity"] == "b"
    assert store.lease["spec"]["leaseTransitions"] == 1
    assert not first.try_acquire(), "the old leader sees it taken"


def test_a_released_lease_is_taken_at_once():
    store, clock = LeaseStore(), Clock()
    first, second = replica(store, clock, "a"), replica(store, clock, "b")
    assert first.try_acquire()
    first.release()
    assert second.try_acquire()


def test_of_two_standbys_taking_an_expired_lease_the_first_write_wins():
    store, clock = LeaseStore(), Clock()
    assert replica(store, clock, "a").try_acquire()
    stale = store.call("GET", "")
    seen = (stale["spec"]["holderIdentity"], stale["spec"]["renewTime"])
    clock.now = 20
    b, c = replica(store, clock, "b"), replica(store, clock, "c")
    for standby in (b, c):
        standby._seen, standby._seen_at = seen, 0.0
    assert b.try_acquire()
    c._read = lambda: json.loads(json.dumps(stale))  # c read the lease before b wrote
    assert not c.try_acquire(), "its write carries the old resourceVersion: 409"
    assert store.lease["spec"]["holderIdentity"] == "b"


def test_keep_leading_calls_on_lost_when_taken_over():
    store, clock = LeaseStore(), Clock()
    lease = LeaderLease(
        store, LeaseSettings("ops", identity="a", lease_seconds=10, renew_seconds=0.01), clock
    )  # type: ignore[arg-type]
    assert lease.try_acquire()
    store.lease["spec"]["holderIdentity"] = "b"  # someone else took it
    lost, stop = threading.Event(), threading.Event()
    keep_leading(lease, stop, lost.set)
    assert lost.is_set()


def test_standby_answers_healthz():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/healthz"
    with StandbyHealth(port), urllib.request.urlopen(url, timeout=5) as reply:
        assert json.load(reply) == {"standby": True}
    with socket.socket() as again:  # freed for kopf's liveness endpoint (which reuses)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("0.0.0.0", port))


def test_status_requests_are_coalesced():
    written: list[tuple[str, str]] = []
    gate = threading.Event()

    def write(key, _indexes):
        gate.wait(5)
        written.append(key)

    queue = StatusQueue(write, workers=1)
    for _ in range(5):
        queue.request(("ns", "first"), {})
    time.sleep(0.05)  # the writer holds "first"
    for _ in range(10):
        queue.request(("ns", "second"), {})
        queue.request(("ns", "third"), {})
    gate.set()
    deadline = time.monotonic() + 5
    while len(written) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert written == [("ns", "first"), ("ns", "second"), ("ns", "third")]
