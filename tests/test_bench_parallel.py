"""``python -m octavo_bench parallel``: layouts parsed, and a tiny run of 1×1 against 2×1
spread over two "hosts" (the leader and one ``--headless`` process) that writes the JSON
(with ratios, ms per step and the workers' communication per step) and the PNG."""

from __future__ import annotations

import json

import pytest

from octavo_bench.cli import main
from octavo_bench.parallel import Layout, parse_layouts


def test_layouts_are_parsed_and_bad_ones_refused():
    parsed = parse_layouts("1x1, 2x1,1x2@2")
    assert parsed == [Layout(1, 1), Layout(2, 1), Layout(1, 2, 2)]
    assert [layout.label for layout in parsed] == ["1x1", "2x1", "1x2@2"]
    for bad in ("2", "0x1", "2xa", "1x2@0", "1x2@x"):
        with pytest.raises(ValueError, match="is not TPxPP"):
            parse_layouts(bad)
    with pytest.raises(ValueError, match="nodes must divide"):
        parse_layouts("1x3@2")


def test_a_tiny_run_reports_ratios_and_communication(tiny_folder, tmp_path):
    folder = str(tiny_folder("llama3"))
    flags = ["--layouts", "1x1,2x1@2", "--scale", "0.05", "--dtype", "float32"]
    flags += ["--kv-cache-memory", "8MiB"]  # per worker: a few workload sequences fit
    code = main(["parallel", "--model", folder, *flags, "--output-dir", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "parallel.json").read_text())
    runs = {(run["layout"], run["workload"]): run for run in report["runs"]}
    assert set(runs) == {(layout, w) for layout in ("1x1", "2x1@2") for w in ("a", "c")}
    assert all(run["tokens_per_s"] > 0 and run["ms_per_step"] > 0 for run in runs.values())
    assert runs[("1x1", "a")]["vs_1x1"] == 1.0 and runs[("1x1", "a")]["comm_ms_per_step"] == {}
    assert runs[("2x1@2", "a")]["comm_ms_per_step"]["all_reduce"] > 0
    host_log = (tmp_path / "hosts-2x1@2" / "node1.log").read_text()
    assert "Traceback" not in host_log
    assert (tmp_path / "parallel.png").stat().st_size > 0
