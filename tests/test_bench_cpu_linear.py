"""``python -m octavo_bench cpu-linear`` on a small step: both kernels timed at each row
count, the step's weight bytes counted from its shape."""

from __future__ import annotations

import json

import pytest

from octavo.kernels.cpu_build import cpu_ops
from octavo.kernels.cpu_features import onednn_supports_bf16
from octavo_bench.cli import main
from octavo_bench.cpu_linear import StepShape

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native CPU kernels built here")


@pytest.mark.parametrize("dtype,size", [("float32", 4), ("bfloat16", 2)])
def test_a_smoke_run_times_both_kernels_at_each_row_count(tmp_path, capsys, dtype, size):
    shape = ["--hidden", "32", "--intermediate", "48", "--heads", "4", "--kv-heads", "2"]
    shape += ["--head-dim", "8", "--vocab", "100", "--layers", "2", "--dtype", dtype]
    argv = ["cpu-linear", "--rows", "1,9", "--repeats", "1", "--num-threads", "1", *shape]
    assert main([*argv, "--output-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "cpu_linear.json").read_text())
    assert [case["rows"] for case in report["cases"]] == [1, 9]
    weight_bytes = StepShape(32, 48, 4, 2, 8, 100, 2, size).weight_bytes
    assert weight_bytes == size * (2 * (64 * 32 + 32 * 32 + 96 * 32 + 32 * 48) + 100 * 32)
    onednn_runs = dtype == "float32" or onednn_supports_bf16()
    for case in report["cases"]:
        assert case["weight_bytes"] == weight_bytes and case["panel_ms"] > 0
        assert (case["onednn_ms"] is not None) is onednn_runs
        assert not onednn_runs or case["speedup"] > 0
    assert "oneDNN / panel" in capsys.readouterr().out
    assert (tmp_path / "cpu_linear.png").is_file()
