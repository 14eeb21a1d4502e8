"""/health probes of a server process until it exits, as a kubelet would see them."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx

from stuck_processes import dump_stacks

Probe = tuple[float, int | None]  # seconds from the start; status, None for no answer


def probe_until_exit(
    process: subprocess.Popen,
    url: str,
    *,
    since: float,
    limit: float,
    describe: Callable[[], str],
) -> list[Probe]:
    """Probe ``url``/health every 50 ms until ``process`` exits (failing after ``limit``
    s from ``since``, with its stacks dumped and ``describe()``): when an answer came, or
    when a probe left that got none (refused, closing, or past its 2 s timeout: a failed
    probe to a kubelet)."""
    probes: list[Probe] = []
    while process.poll() is None:
        if time.monotonic() >= since + limit:
            dump_stacks(process.pid)
            raise AssertionError(describe())
        sent = time.monotonic() - since
        try:
            status = httpx.get(f"{url}/health", timeout=2).status_code
            probes.append((time.monotonic() - since, status))
        except httpx.TransportError:
            probes.append((sent, None))
        time.sleep(0.05)
    return probes


def health_until_exit(group, leader, *, since: float, limit: float) -> list[Probe]:
    """A multi-node leader's probes until it exits (``multinode_cluster``'s NodeGroup and
    Host), seconds from ``since``."""
    return probe_until_exit(
        leader.process, group.url, since=since, limit=limit, describe=group.logs
    )


def assert_unhealthy_within(probes: list[Probe], exited: float, limit: float) -> None:
    """Unhealthy within ``limit`` s (a 503 or no answer: a closing server, or one too busy
    to answer in time, as on a loaded CI machine; or gone: ``exited`` s), and never a 200
    after that."""
    failed = next((seconds for seconds, status in probes if status != 200), exited)
    assert failed < limit, probes
    assert all(status != 200 for seconds, status in probes if seconds >= failed), probes
