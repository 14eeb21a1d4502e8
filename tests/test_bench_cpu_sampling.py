"""``python -m octavo_bench cpu-sampling`` on a small vocabulary: every setting timed on both
paths, and both paths draw real tokens."""

from __future__ import annotations

import json

import pytest

from octavo.kernels.cpu_build import cpu_ops
from octavo_bench.cli import main
from octavo_bench.cpu_sampling import SETTINGS

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native CPU kernels built here")


def test_a_smoke_run_times_each_setting_on_both_paths(tmp_path, capsys):
    argv = ["cpu-sampling", "--rows", "1,3", "--vocab", "500", "--repeats", "1"]
    assert main([*argv, "--num-threads", "1", "--output-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "cpu_sampling.json").read_text())
    cases = [(case["rows"], case["setting"]) for case in report["cases"]]
    assert cases == [(rows, setting) for rows in (1, 3) for setting in SETTINGS]
    for case in report["cases"]:
        assert case["native_ms"] > 0 and case["torch_ms"] > 0 and case["speedup"] > 0
    assert "top-p 0.95" in capsys.readouterr().out
    assert (tmp_path / "cpu_sampling.png").is_file()
