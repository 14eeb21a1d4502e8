"""The suite's time budget: the order files run in, and what the run took.

CI runs ``make test`` on a 2-core machine with a hard limit, the unit suite on both cores
with pytest-xdist (``-n 2 --dist loadfile``: a file's tests stay on one worker, so its
module-scoped engines and servers start once). xdist hands files out in collection order,
so a long file collected last would run alone at the end: files are ordered longest first
by the seconds recorded in ``durations.json`` beside this file (a file not in it counts as
``UNKNOWN_FILE_S``). ``OCTAVO_WRITE_TEST_DURATIONS=1 make test`` rewrites it from the run.

At the end of every run (``make test`` and plain pytest) a summary adds to pytest's own
``--durations=25``: the wall time, the summed test time (setup + call + teardown, over every
worker) and the files that take the most of it, so a new test's cost shows in the run that
adds it.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS_FILE = Path(__file__).with_name("durations.json")
WRITE_ENV = "OCTAVO_WRITE_TEST_DURATIONS"
UNKNOWN_FILE_S = 20.0
SLOWEST_FILES = 15
_started = time.monotonic()


def recorded_durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS_FILE.read_text())
    except (OSError, ValueError):
        return {}


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items: list[pytest.Item]) -> None:
    """Longest files first; a file's own tests keep their order."""
    recorded = recorded_durations()
    first_seen = {file_of(item.nodeid): index for index, item in reversed(list(enumerate(items)))}

    def key(item: pytest.Item) -> tuple[float, int]:
        name = file_of(item.nodeid)
        return (-recorded.get(name, UNKNOWN_FILE_S), first_seen[name])

    items.sort(key=key)


def file_totals(reports: list[pytest.TestReport]) -> dict[str, float]:
    """Seconds per test file, setup, call and teardown together."""
    totals: dict[str, float] = defaultdict(float)
    for report in reports:
        totals[file_of(report.nodeid)] += report.duration
    return dict(totals)


def timing_lines(totals: dict[str, float], wall_s: float) -> list[str]:
    summed = sum(totals.values())
    lines = [f"wall {wall_s:.0f} s; tests {summed:.0f} s summed over {len(totals)} files"]
    slowest = sorted(totals.items(), key=lambda item: item[1], reverse=True)[:SLOWEST_FILES]
    lines += [f"{seconds:8.1f} s  {name}" for name, seconds in slowest]
    return lines


def worker_of(report) -> str:
    """The xdist worker that ran the report's test ("main" without xdist)."""
    node = getattr(report, "node", None)
    gateway = getattr(node, "gateway", None)
    return str(getattr(report, "worker_id", None) or getattr(gateway, "id", None) or "main")


def worker_lines(reports: list) -> list[str]:
    """Per worker: the seconds spent in tests against the span from its first test's start
    to its last one's end; a worker busy far less than its span stood idle between tests."""
    spans: dict[str, list[float]] = {}
    for report in reports:
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if not start or not stop:  # none, or 0 on the report xdist makes for a crashed worker
            continue
        first, last, busy = spans.get(worker_of(report), [start, stop, 0.0])
        spans[worker_of(report)] = [min(first, start), max(last, stop), busy + report.duration]
    if not spans:
        return []
    began = min(first for first, _, _ in spans.values())
    return [
        f"{name}: busy {busy:.0f} s of {last - first:.0f} s (first test at +{first - began:.0f} s)"
        for name, (first, last, busy) in sorted(spans.items())
    ]


def write_durations(totals: dict[str, float]) -> None:
    """Merge this run's unit-test files into ``durations.json`` (the e2e suite keeps its order)."""
    measured = {name: round(s, 1) for name, s in totals.items() if name.startswith("tests/")}
    merged = {**recorded_durations(), **measured}
    DURATIONS_FILE.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller prints it
        return
    reports = [
        report
        for outcome in terminalreporter.stats.values()
        for report in outcome
        if isinstance(report, pytest.TestReport)
    ]
    if not reports:
        return
    totals = file_totals(reports)
    terminalreporter.section("suite time")
    for line in [*timing_lines(totals, time.monotonic() - _started), *worker_lines(reports)]:
        terminalreporter.write_line(line)
    if os.environ.get(WRITE_ENV) == "1":
        write_durations(totals)
        terminalreporter.write_line(f"per-file seconds written to {DURATIONS_FILE}")
