"""Leader election over a Lease (against an in-memory stand-in of the Lease API with
resourceVersion checks, on clocks the test moves), a leader paused with SIGSTOP while a
standby takes over, the standby's /healthz, and coalesced status writes."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import socket
import threading
import time
import urllib.request

import pytest

from lease_replica import (
    NAMESPACE,
    LeaseStore,
    PublishingLease,
    SharedClock,
    StoreManager,
    VirtualClock,
    lead_and_act,
)
from octavo_operator.kube import Kube, NotLeading
from octavo_operator.leader import (
    LEASE_LOST_EXIT_CODE,
    LeaderLease,
    LeaseSettings,
    keep_leading,
    watch_deadline,
)
from octavo_operator.main import main
from octavo_operator.standby import StandbyHealth
from octavo_operator.status_queue import StatusQueue

STEP = 0.5  # seconds of lease time between two looks


def replica(store: LeaseStore, clock: object, name: str) -> LeaderLease:
    """A replica with client-go's timings: 15 s lease, 10 s renew deadline, 2 s retry."""
    return LeaderLease(store, LeaseSettings(NAMESPACE, identity=name), clock)  # type: ignore[arg-type]


def test_timings_are_client_gos_and_checked():
    settings = LeaseSettings(NAMESPACE)
    assert (settings.lease_seconds, settings.renew_deadline_seconds, settings.retry_seconds) == (
        15.0,
        10.0,
        2.0,
    )
    with pytest.raises(ValueError, match="lease > renew deadline > retry period"):
        LeaseSettings(NAMESPACE, lease_seconds=10, renew_deadline_seconds=10)
    with pytest.raises(SystemExit) as refused:
        main(["--leader-elect", "--leader-elect-renew-deadline", "20"])
    assert refused.value.code == 2


def test_one_leader_and_a_takeover_only_after_the_lease_time():
    store, clock = LeaseStore(), VirtualClock()
    first, second = replica(store, clock, "a"), replica(store, clock, "b")
    assert first.try_acquire() and not second.try_acquire()
    clock.value = 5
    assert first.try_acquire(), "the holder renews"
    assert not second.try_acquire(), "a renewed lease is not free"
    clock.value = 19  # 14 s since b last saw the record change
    assert not second.try_acquire()
    clock.value = 21  # a stopped renewing at t=5: 16 s unchanged
    assert second.try_acquire()
    assert store.lease["spec"]["holderIdentity"] == "b"
    assert store.lease["spec"]["leaseTransitions"] == 1
    assert not first.try_acquire() and not first.leads(), "the old leader sees it taken"


def test_a_leader_that_cannot_renew_stops_before_anyone_may_take_over():
    """The API fails from t=1: the leader leads until 10 s after its last renewal started
    (t=0), the standby may take over 15 s after it saw that renewal; at no instant both."""
    store, clock = LeaseStore(), VirtualClock()
    leader, standby = replica(store, clock, "a"), replica(store, clock, "b")
    assert leader.try_acquire() and not standby.try_acquire()
    steps, took_over = [k * STEP for k in range(1, 60)], None
    for now in steps:
        clock.value = now
        store.failing = now < 15
        if now % 2 == 0:  # each replica's retry period; the leader's only while it leads
            for lease in (leader, standby) if leader.leads() else (standby,):
                try:
                    took = lease.try_acquire()
                except Exception:
                    took = False
                took_over = took_over or (now if took and lease is standby else None)
        assert not (leader.leads() and standby.leads()), f"two leaders at t={now}"
        assert leader.leads() == (now < 10), now
    assert took_over == 16, "the first retry after 15 s"


def test_keep_leading_calls_on_lost_when_taken_over():
    store, clock = LeaseStore(), VirtualClock()
    lease = replica(store, clock, "a")
    assert lease.try_acquire()
    store.lease["spec"]["holderIdentity"] = "b"  # someone else took it
    lost, stop = threading.Event(), threading.Event()
    keep_leading(lease, stop, lost.set)
    assert lost.is_set() and not lease.leads()


def test_the_deadline_is_reported_while_a_renewal_hangs():
    """watch_deadline does not wait for the renewer: it reports at the deadline itself."""
    store, clock = LeaseStore(), VirtualClock()
    lease = replica(store, clock, "a")
    assert lease.try_acquire()
    lost, stop = threading.Event(), threading.Event()
    watch_deadline(lease, stop, lost.set)
    assert lost.is_set() and clock.now() == 10.0 and not lease.leads()


def test_writes_are_refused_once_the_lease_is_lost():
    kube = Kube(None, may_write=lambda: False)  # type: ignore[arg-type]
    with pytest.raises(NotLeading) as refused:
        kube.call("PATCH", "/apis/apps/v1/namespaces/a/deployments/b", {})
    assert refused.value.status == 503 and "leader Lease" in refused.value.reason


def test_of_two_standbys_taking_an_expired_lease_the_first_write_wins():
    store, clock = LeaseStore(), VirtualClock()
    assert replica(store, clock, "a").try_acquire()
    stale = store.call("GET", "")
    seen = (stale["spec"]["holderIdentity"], stale["spec"]["renewTime"])
    clock.value = 20
    b, c = replica(store, clock, "b"), replica(store, clock, "c")
    for standby in (b, c):
        standby._seen, standby._seen_at = seen, 0.0
    assert b.try_acquire()
    c._read = lambda: json.loads(json.dumps(stale))  # c read the lease before b wrote
    assert not c.try_acquire(), "its write carries the old resourceVersion: 409"
    assert store.lease["spec"]["holderIdentity"] == "b"


def test_a_released_lease_is_taken_at_once():
    store, clock = LeaseStore(), VirtualClock()
    first, second = replica(store, clock, "a"), replica(store, clock, "b")
    assert first.try_acquire()
    first.release()
    assert not first.leads() and second.try_acquire()


@pytest.fixture
def lease_api():
    """The Lease store in a manager process that both the test and a replica process use."""
    manager = StoreManager(ctx=multiprocessing.get_context("spawn"))
    manager.start()
    yield manager
    manager.shutdown()


def wait_real(ready, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_paused_leader_never_leads_alongside_the_standby_that_took_over(lease_api):
    """A leader process (lease_replica.lead_and_act) is stopped with SIGSTOP at t=5.5 on a
    clock the test moves; the standby takes the Lease once it has seen no renewal for the
    lease time; the leader, continued (SIGCONT) long after, must not act again and exits
    as having lost the Lease. At every instant, at most one believes it leads."""
    spawn = multiprocessing.get_context("spawn")
    clock = spawn.RawValue("d", 0.0)
    valid_until, last_action = spawn.RawValue("d", -1.0), spawn.RawValue("d", -1.0)
    authkey = bytes(multiprocessing.current_process().authkey)
    paused = spawn.Process(
        target=lead_and_act,
        daemon=True,
        args=(lease_api.address, authkey, clock, valid_until, last_action),
    )
    paused.start()
    try:
        wait_real(lambda: valid_until.value > 0, 60, "the replica process to lead")
        settings = LeaseSettings(NAMESPACE, identity="standby")
        standby = PublishingLease(
            lease_api.store(), settings, SharedClock(clock), spawn.RawValue("d", -1.0)
        )

        def look(now: float, running: bool) -> bool:
            """Move the clock; the standby tries every 2 s; True once the standby leads."""
            clock.value = now
            time.sleep(0.02 if running else 0.0)  # the replica's threads see the clock
            if now % 2 == 0:
                standby.try_acquire()
            paused_leads = now < valid_until.value and paused.exitcode is None
            assert not (paused_leads and standby.leads()), f"two leaders at t={now}"
            return standby.leads()

        for now in [k * STEP for k in range(1, 12)]:  # up to t=5.5: renewed at 2 and 4
            assert not look(now, running=True), "the standby waits while the leader renews"
        os.kill(paused.pid, signal.SIGSTOP)
        believed_until = valid_until.value
        assert 4 + 10 <= believed_until <= 5.5 + 10, believed_until
        took_over = next(
            now for now in [k * STEP for k in range(12, 80)] if look(now, running=False)
        )
        assert took_over >= 4 + 15, "not before a full lease time after the last renewal"
        os.kill(paused.pid, signal.SIGCONT)
        for now in [took_over + k * STEP for k in range(1, 20)]:
            look(now, running=True)
        paused.join(timeout=30)
        assert paused.exitcode == LEASE_LOST_EXIT_CODE
        assert 5 <= last_action.value < believed_until, "it acted only while it led"
        assert lease_api.store().holder() == "standby"
    finally:
        if paused.exitcode is None:
            os.kill(paused.pid, signal.SIGCONT)
            paused.kill()


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


def test_an_elected_operator_stops_on_a_signal_though_the_lease_was_never_lost(monkeypatch):
    """kopf waits for its stop flag in a task; given the Lease's ``threading.Event`` it
    waited in the loop's default executor, so after a SIGTERM (kopf's tasks cancelled, the
    flag never set) ``asyncio.run`` waited forever for that thread at exit: the leader never
    exited and never gave the Lease up. The flag kopf gets now is the loop's own."""
    from argparse import Namespace

    from kopf._cogs.aiokits.aioadapters import wait_flag

    from octavo_operator import runner

    async def operator_stopped_by_a_signal(*, stop_flag, **_) -> None:
        waiter = asyncio.create_task(wait_flag(stop_flag))  # as kopf's stop-flag checker
        await asyncio.sleep(0.05)
        waiter.cancel()  # SIGTERM: kopf cancels its tasks and returns

    monkeypatch.setattr(runner.kopf, "operator", operator_stopped_by_a_signal)
    lost = threading.Event()
    args = Namespace(liveness_port=None, namespace=[])
    done = threading.Thread(target=runner._operate, args=(args, lost, lambda: True), daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), "the operator's loop did not end after the signal"
    assert not lost.is_set()


def test_the_lease_lost_flag_stops_the_operator():
    from octavo_operator.runner import asyncio_flag

    lost = threading.Event()

    async def until_stopped() -> float:
        stop = asyncio_flag(lost)
        threading.Timer(0.05, lost.set).start()
        started = time.monotonic()
        await asyncio.wait_for(stop.wait(), 5)
        return time.monotonic() - started

    assert asyncio.run(until_stopped()) < 5
