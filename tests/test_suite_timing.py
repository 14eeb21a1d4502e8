"""The suite's own time budget (tests/suite_timing.py): files go out longest first, a file's
tests keep their order, and the summary adds up per file."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import suite_timing


@dataclass
class FakeItem:
    nodeid: str


@dataclass
class FakeReport:
    nodeid: str
    duration: float
    start: float | None = None
    stop: float | None = None
    worker_id: str | None = None


def test_files_are_ordered_longest_first_keeping_their_own_order(monkeypatch):
    recorded = {"tests/test_slow.py": 300.0, "tests/test_quick.py": 1.0}
    monkeypatch.setattr(suite_timing, "recorded_durations", lambda: recorded)
    names = ["test_quick.py::a", "test_new.py::a", "test_slow.py::b", "test_quick.py::b"]
    names += ["test_slow.py::a", "test_new.py::b"]
    items = [FakeItem(f"tests/{name}") for name in names]
    suite_timing.pytest_collection_modifyitems(None, None, items)
    assert [item.nodeid.removeprefix("tests/") for item in items] == [
        "test_slow.py::b",
        "test_slow.py::a",
        "test_new.py::a",  # unknown: UNKNOWN_FILE_S, between the two
        "test_new.py::b",
        "test_quick.py::a",
        "test_quick.py::b",
    ]


def test_the_summary_adds_setup_call_and_teardown_per_file():
    reports = [FakeReport("tests/test_a.py::x", 1.5), FakeReport("tests/test_a.py::y", 2.0)]
    reports.append(FakeReport("tests/test_b.py::z", 0.5))
    totals = suite_timing.file_totals(reports)
    assert totals == {"tests/test_a.py": 3.5, "tests/test_b.py": 0.5}
    lines = suite_timing.timing_lines(totals, wall_s=10)
    assert lines[0] == "wall 10 s; tests 4 s summed over 2 files"
    assert lines[1].split() == ["3.5", "s", "tests/test_a.py"]


def test_recorded_durations_name_existing_unit_test_files():
    recorded = suite_timing.recorded_durations()
    if not recorded:
        pytest.fail(f"{suite_timing.DURATIONS_FILE} is missing or empty")
    from pathlib import Path

    root = Path(__file__).parent.parent
    assert all(name.startswith("tests/") for name in recorded)
    stale = [name for name in recorded if not (root / name).is_file()]
    assert not stale, f"durations.json names files that are gone: {stale}"


def test_each_worker_s_busy_time_is_set_against_its_span():
    """A worker that stood idle between its tests shows busy time well under its span."""
    reports = [
        FakeReport("tests/test_a.py::x", 10.0, start=100.0, stop=110.0, worker_id="gw0"),
        FakeReport("tests/test_a.py::y", 5.0, start=110.0, stop=115.0, worker_id="gw0"),
        FakeReport("tests/test_b.py::z", 4.0, start=102.0, stop=106.0, worker_id="gw1"),
        FakeReport("tests/test_b.py::w", 4.0, start=146.0, stop=150.0, worker_id="gw1"),
        FakeReport("tests/test_c.py::v", 1.0),  # no timestamps: left out
        FakeReport("tests/test_d.py::u", 0.0, start=0.0, stop=0.0, worker_id="gw1"),  # crashed
    ]
    assert suite_timing.worker_lines(reports) == [
        "gw0: busy 15 s of 15 s (first test at +0 s)",
        "gw1: busy 8 s of 48 s (first test at +2 s)",
    ]
    assert suite_timing.worker_lines([FakeReport("tests/test_c.py::v", 1.0)]) == []


def test_make_test_counts_every_core_with_one_torch_thread_exported():
    """`make test` exports OMP_NUM_THREADS=1, which GNU nproc answers: the xdist worker count
    must still be the cores this process may use (it once ran the unit suite on one)."""
    script = Path(__file__).parents[1] / "scripts" / "run-tests.sh"
    line = next(x for x in script.read_text().splitlines() if x.startswith("workers="))
    env = {key: value for key, value in os.environ.items() if key != "OCTAVO_TEST_WORKERS"}
    env["OMP_NUM_THREADS"] = "1"
    shown = subprocess.run(
        ["bash", "-c", f'{line}; echo "$workers"'], env=env, capture_output=True, text=True
    )
    assert shown.stdout.strip() == str(len(os.sched_getaffinity(0)))
