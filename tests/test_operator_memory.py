"""What gives the operator's memory back after a burst: the elastic thread pool (threads
for the burst, gone after it) and the trimmer (one release for a burst of deletions)."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY

from octavo_operator import metrics  # noqa: F401 (registers the gauges)
from octavo_operator.elastic_executor import ElasticExecutor
from octavo_operator.memory import Trimmer, heap_usage


def wait_until(check, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


def test_the_pool_grows_for_a_burst_and_shrinks_after_it() -> None:
    pool = ElasticExecutor(max_workers=8, idle_seconds=0.2)
    gate = threading.Event()
    futures = [pool.submit(lambda i=i: (gate.wait(5), i)[1]) for i in range(20)]
    assert wait_until(lambda: pool.threads == 8), "a blocked burst gets every worker"
    gate.set()
    assert [f.result(timeout=5) for f in futures] == list(range(20))
    assert wait_until(lambda: pool.threads == 0, timeout=3), "idle workers exit"
    assert pool.submit(lambda: "again").result(timeout=5) == "again", "and come back"


def test_errors_reach_the_caller_and_the_worker_goes_on() -> None:
    pool = ElasticExecutor(max_workers=1, idle_seconds=1)
    failing = pool.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=5)
    assert pool.submit(lambda: 42).result(timeout=5) == 42
    pool.shutdown()
    assert wait_until(lambda: pool.threads == 0)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)


def test_sequential_work_reuses_one_worker() -> None:
    pool = ElasticExecutor(max_workers=8, idle_seconds=1)
    for i in range(50):
        assert pool.submit(lambda i=i: i * 2).result(timeout=5) == i * 2
    assert pool.threads == 1


def test_a_burst_of_deletions_is_one_release() -> None:
    trimmer = Trimmer(delay=0.1)
    released = []
    trimmer.releases.append(lambda: released.append(time.monotonic()))
    for _ in range(100):
        trimmer.request()
    assert wait_until(lambda: len(released) == 1)
    time.sleep(0.3)
    assert len(released) == 1
    trimmer.request()
    assert wait_until(lambda: len(released) == 2)


def allocation_moves() -> tuple[int, int]:
    """Bytes in use gained by a live 256 MiB allocation, and lost when it is freed."""
    before = heap_usage()
    block = bytearray(256 * 2**20)  # above the mmap threshold: counted in in_use, then gone
    grown = heap_usage()
    del block
    after = heap_usage()
    return grown.in_use - before.in_use, grown.in_use - after.in_use


def test_heap_gauges_follow_live_allocations() -> None:
    """glibc's mallinfo2: bytes in use grow with a live allocation and shrink when it is
    freed (the figures the operator bench reports beside its RSS)."""
    if heap_usage() is None:
        pytest.skip(reason="no glibc mallinfo2 here (musl or glibc < 2.33)")
    # Other threads of the test process (servers of earlier tests in this pytest worker
    # winding down) allocate and free meanwhile: a wide margin, and a few tries.
    moves = [allocation_moves() for _ in range(3)]
    assert any(grew >= 200 * 2**20 and shrank >= 200 * 2**20 for grew, shrank in moves), moves
    scraped = {
        name: REGISTRY.get_sample_value(f"octavo_operator_heap_{name}_bytes")
        for name in ("in_use", "free")
    }
    assert scraped["in_use"] > 0 and scraped["free"] >= 0, scraped
