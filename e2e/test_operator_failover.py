"""Two operator replicas with leader election: one leads (holds the Lease) and reconciles,
the other stands by and reconciles nothing; kill the leader (SIGKILL: no hand-over) and
the standby takes over after the lease time, reconciling what changed while nobody led.
Pause the leader instead (SIGSTOP): the same takeover, and the paused one, continued, stops
and exits without reconciling again.

The replicas run with shorter timings than client-go's 15 s lease, 10 s renew deadline and
2 s retry period (the defaults, unit-tested in tests/), given through the chart's
--leader-elect-* flags: a takeover is judged against the lease time it was given, and an
8 s lease, renewed every second, keeps a 6 s renew deadline (6x the retry period, many
times an apiserver round trip on a loaded machine) while it halves each test's wait."""

from __future__ import annotations

import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

from e2e import isvc
from e2e.helpers import wait_for
from e2e.operator_process import NAMESPACE, OperatorProcess
from octavo_operator.leader import LEASE_LOST_EXIT_CODE

LEASE_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_SECONDS = 8.0, 6.0, 1.0
TAKEOVER_DEADLINE_SECONDS = LEASE_SECONDS + RETRY_SECONDS + 5.0  # + kopf's start, catch-up
ELECT = (
    "--leader-elect",
    "--leader-election-namespace",
    NAMESPACE,
    "--leader-elect-lease-duration",
    str(LEASE_SECONDS),
    "--leader-elect-renew-deadline",
    str(RENEW_DEADLINE_SECONDS),
    "--leader-elect-retry-period",
    str(RETRY_SECONDS),
)


def start_replicas(cluster, tmp_path: Path) -> list[OperatorProcess]:
    """Two replicas, started side by side (each start waits for its /healthz)."""
    replicas = [OperatorProcess(cluster, tmp_path / f"replica-{i}", args=ELECT) for i in (0, 1)]
    with ThreadPoolExecutor(len(replicas)) as pool:
        list(pool.map(OperatorProcess.start, replicas))
    return replicas


def leads(operator: OperatorProcess) -> bool:
    found = re.search(r"^octavo_operator_leader (\S+)$", operator.metrics(), re.M)
    return bool(found) and float(found.group(1)) == 1.0


def reconciles(operator: OperatorProcess) -> float:
    text = operator.metrics()
    return sum(
        float(v) for v in re.findall(r"^octavo_operator_reconciles_total\{.*\} (\S+)$", text, re.M)
    )


def deployment_args(apps: client.AppsV1Api, namespace: str, name: str) -> list[str] | None:
    try:
        return (
            apps.read_namespaced_deployment(name, namespace).spec.template.spec.containers[0].args
        )
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_the_standby_takes_over_when_the_leader_dies(
    cluster, operator, no_other_operator, namespace, custom, apps, tmp_path
):
    replicas = start_replicas(cluster, tmp_path)
    try:
        wait_for(lambda: sum(leads(r) for r in replicas) == 1, timeout=30, what="one leader")
        leader = next(r for r in replicas if leads(r))
        standby = next(r for r in replicas if r is not leader)
        isvc.create(custom, namespace, isvc.manifest("before", {"replicas": 1}))
        wait_for(
            lambda: deployment_args(apps, namespace, "before"),
            timeout=15,
            what="the leader's Deployment",
        )
        assert reconciles(standby) == 0 and not leads(standby), "the standby reconciles nothing"

        leader.proc.kill()  # no hand-over: the standby waits the lease out
        killed = time.monotonic()
        isvc.patch(custom, namespace, "before", {"spec": {"engine": {"maxNumSeqs": 7}}})
        isvc.create(custom, namespace, isvc.manifest("during", {"replicas": 1}))

        def caught_up() -> bool:
            args = deployment_args(apps, namespace, "before") or []
            return (
                "--max-num-seqs" in args and deployment_args(apps, namespace, "during") is not None
            )

        wait_for(
            caught_up,
            timeout=TAKEOVER_DEADLINE_SECONDS + 15,
            interval=0.2,
            what="the standby reconciling what changed",
            describe=standby.tail,
        )
        took = time.monotonic() - killed
        assert leads(standby)
        assert took < TAKEOVER_DEADLINE_SECONDS, f"takeover took {took:.1f} s"
        assert took >= LEASE_SECONDS - RETRY_SECONDS, "not before the lease time"
        print(f"takeover and catch-up: {took:.1f} s")
        # An elected leader stops on SIGTERM (a rollout) and gives the Lease up; it used
        # to hang at exit until killed.
        standby.proc.terminate()
        assert standby.proc.wait(timeout=15) == 0, standby.tail()
    finally:
        for replica in replicas:
            if replica.proc is not None and replica.proc.poll() is None:
                replica.stop()
            replica.proc = None


def test_a_paused_leader_yields_and_exits_when_it_wakes(
    cluster, operator, no_other_operator, namespace, custom, apps, tmp_path
):
    """SIGSTOP the leader (a frozen node, a long pause): the standby takes over after the
    lease time and reconciles; SIGCONT, the old leader knows at once that its renew
    deadline has passed, stops without reconciling and exits as having lost the Lease (3)."""
    replicas = start_replicas(cluster, tmp_path)
    try:
        wait_for(lambda: sum(leads(r) for r in replicas) == 1, timeout=30, what="one leader")
        paused = next(r for r in replicas if leads(r))
        standby = next(r for r in replicas if r is not paused)
        isvc.create(custom, namespace, isvc.manifest("held", {"replicas": 1}))
        wait_for(
            lambda: deployment_args(apps, namespace, "held"),
            timeout=15,
            what="the leader's Deployment",
        )
        paused.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        isvc.patch(custom, namespace, "held", {"spec": {"engine": {"maxNumSeqs": 7}}})
        wait_for(
            lambda: "--max-num-seqs" in (deployment_args(apps, namespace, "held") or []),
            timeout=TAKEOVER_DEADLINE_SECONDS + 15,
            interval=0.2,
            what="the standby reconciling",
            describe=standby.tail,
        )
        assert time.monotonic() - stopped >= LEASE_SECONDS - RETRY_SECONDS
        assert leads(standby)
        paused.proc.send_signal(signal.SIGCONT)
        assert paused.proc.wait(timeout=30) == LEASE_LOST_EXIT_CODE, paused.tail()
        assert reconciles(standby) > 0 and leads(standby)
        assert "Traceback" not in paused.tail(400), paused.tail(80)
    finally:
        for replica in replicas:
            if replica.proc is not None and replica.proc.poll() is None:
                replica.proc.send_signal(signal.SIGCONT)
                replica.stop()
            replica.proc = None
