"""How many CPUs this process may really use: its affinity mask, capped by a cgroup CPU
quota (a Kubernetes CPU limit), which ``os.cpu_count()`` and torch's default both miss;
and how many compute threads a worker takes when ``--num-threads`` is not given."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def usable_cpus() -> int:
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(count, math.ceil(quota)) if quota is not None else count)


def default_threads(workers: int) -> int:
    """Compute threads per worker without ``--num-threads``: ``OMP_NUM_THREADS`` when it is
    set (OpenMP's own variable, the first level of a nested list), else the usable CPUs
    shared out among this host's ``workers``. Two OpenMP threads per process on a CPU
    that other processes keep busy spin at every barrier: six test files took 131 s with
    two threads per engine and 61 s with one, two engines at a time on 2 cores."""
    configured = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, usable_cpus() // workers)


def cgroup_cpu_quota() -> float | None:
    """CPUs granted by the cgroup's quota (e.g. 2.5), or None when unlimited or unknown."""
    try:
        if CGROUP_V2_CPU_MAX.exists():
            quota, period = CGROUP_V2_CPU_MAX.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if CGROUP_V1_QUOTA.exists():
            quota_us = int(CGROUP_V1_QUOTA.read_text())
            return None if quota_us <= 0 else quota_us / int(CGROUP_V1_PERIOD.read_text())
    except (OSError, ValueError):
        return None
    return None
