"""``python -m octavo_bench parallel``: layouts parsed, and a tiny run of 1×1 against 2×1
that writes the JSON (with ratios and the workers' communication per step) and the PNG."""

from __future__ import annotations

import json

import pytest

from octavo_bench.cli import main
from octavo_bench.parallel import parse_layouts


def test_layouts_are_parsed_and_bad_ones_refused():
    assert parse_layouts("1x1, 2x1,1x2") == [(1, 1), (2, 1), (1, 2)]
    for bad in ("2", "0x1", "2xa"):
        with pytest.raises(ValueError, match="is not TPxPP"):
            parse_layouts(bad)


def test_a_tiny_run_reports_ratios_and_communication(tiny_folder, tmp_path):
    folder = str(tiny_folder("llama3"))
    code = main(["parallel", "--model", folder, "--layouts", "1x1,2x1", "--scale", "0.05",
                 "--dtype", "float32", "--output-dir", str(tmp_path)])  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "parallel.json").read_text())
    runs = {(run["layout"], run["workload"]): run for run in report["runs"]}
    assert set(runs) == {(layout, w) for layout in ("1x1", "2x1") for w in ("a", "c")}
    assert all(run["tokens_per_s"] > 0 and run["steps"] > 0 for run in runs.values())
    assert runs[("1x1", "a")]["vs_1x1"] == 1.0 and runs[("1x1", "a")]["comm_ms_per_step"] == {}
    assert runs[("2x1", "a")]["comm_ms_per_step"]["all_reduce"] > 0
    assert (tmp_path / "parallel.png").stat().st_size > 0
