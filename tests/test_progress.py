"""The start-up progress reporter (``octavo.progress``): a bar on a terminal, log lines
with phase, percent and rate elsewhere, and listener reports at most every half second."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from octavo import progress
from octavo.progress import DownloadBar, PhaseProgress, PhaseReporter, track


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def reports():
    seen: list[PhaseProgress] = []
    progress.add_listener(seen.append)
    yield seen
    progress.remove_listener(seen.append)


def test_off_a_terminal_logs_phase_percent_and_rate_every_few_seconds(caplog, reports):
    clock, stream = FakeClock(), io.StringIO()
    caplog.set_level(logging.INFO, logger="octavo.progress")
    with PhaseReporter("loading weights", 12, "tensors", stream=stream, clock=clock) as bar:
        for _ in range(12):
            clock.now += 1.0
            bar.update()
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "loading weights: 41.7% (5 of 12 tensors, 1 tensors/s)",
        "loading weights: 83.3% (10 of 12 tensors, 1 tensors/s)",
        "loading weights: done, 12 tensors in 12.0 s",
    ]
    assert stream.getvalue() == ""  # no bar drawn into a log


def test_on_a_terminal_draws_a_bar_and_logs_nothing(caplog):
    clock, stream = FakeClock(), Terminal()
    caplog.set_level(logging.INFO, logger="octavo.progress")
    with PhaseReporter("capturing CUDA graphs", 4, "graphs", stream=stream, clock=clock) as bar:
        for _ in range(4):
            clock.now += 10.0
            bar.update()
    drawn = stream.getvalue()
    assert "capturing CUDA graphs" in drawn and "4/4" in drawn and "100%" in drawn
    assert caplog.records == []


def test_listeners_hear_at_most_every_half_second_plus_start_and_end(reports):
    clock = FakeClock()
    with PhaseReporter("loading weights", 16, "tensors", stream=io.StringIO(), clock=clock) as bar:
        for _ in range(16):  # 2 s of work, one tensor every 0.125 s
            clock.now += 0.125
            bar.update()
    assert [report.percent for report in reports] == [0.0, 25.0, 50.0, 75.0, 100.0, 100.0]
    assert reports[-1].finished and not reports[-2].finished
    assert reports[2].rate == pytest.approx(8.0)


def test_bytes_and_unknown_totals_read_well():
    size = PhaseProgress("downloading model", 3 * 2**30, 6 * 2**30, "B", 50 * 2**20)
    assert size.describe() == "downloading model: 50.0% (3.0 GiB of 6.0 GiB, 50.0 MiB/s)"
    unknown = PhaseProgress("loading weights", 7, None, "tensors", 3.5)
    assert unknown.percent is None
    assert unknown.describe() == "loading weights: running (7 tensors, 3.5 tensors/s)"


def test_track_counts_each_item(reports):
    assert list(track(["a", "b", "c"], "building CPU kernels", unit="builds")) == ["a", "b", "c"]
    assert reports[0].total == 3 and reports[-1].done == 3 and reports[-1].finished


def test_a_failing_listener_does_not_break_the_work(reports):
    def broken(_: PhaseProgress) -> None:
        raise RuntimeError("listener bug")

    progress.add_listener(broken)
    try:
        with PhaseReporter("loading weights", 2, stream=io.StringIO()) as bar:
            bar.update(2)
    finally:
        progress.remove_listener(broken)
    assert reports[-1].done == 2


def test_download_bar_reports_the_hubs_byte_bar_only(monkeypatch, reports):
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pod: the library's bars hidden
    files = DownloadBar(total=3, desc="Fetching 3 files")
    files.update(1)
    files.close()
    assert reports == []
    data = DownloadBar(total=0, desc="Reconstructing (incomplete total...)", unit="B")
    data.total = 4096  # huggingface_hub grows the total as each file starts
    data.update(1024)
    data.close()
    assert reports[-1].phase == "downloading model"
    assert reports[-1].percent == 25.0 and reports[-1].finished
    assert sys.stderr.getvalue() == ""
