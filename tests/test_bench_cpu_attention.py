"""``python -m octavo_bench cpu-attention`` on tiny cases: every row measured against the
torch path, and vLLM's side reported as skipped with its reason where vLLM cannot load."""

from __future__ import annotations

import json
import sys

import pytest

from octavo.kernels.cpu_build import cpu_ops
from octavo_bench.cli import main

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native CPU kernels built here")


def test_a_smoke_run_measures_each_case_against_the_torch_path(tmp_path, capsys):
    argv = ["cpu-attention", "--prefill", "20,33", "--decode", "3x40", "--repeats", "1"]
    argv += ["--num-threads", "1", "--vllm-python", sys.executable, "--block-size", "32"]
    assert main([*argv, "--output-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "cpu_attention.json").read_text())
    assert report["config"]["block_size"] == 32 and report["config"]["vllm_block_size"] == 128
    rows = {row["name"]: row for row in report["results"]}
    assert list(rows) == ["prefill 20", "prefill 33", "decode 3x40"]
    for row in rows.values():
        assert row["octavo_ms"] > 0 and row["torch_ms"] > 0 and row["vllm_ms"] is None
        assert row["max_abs_diff"] < 2e-2  # bf16: the kernels round once, as the torch path
        assert row["octavo_gflops"] > 0 and row["octavo_vs_torch"] > 0
    assert rows["prefill 20"]["gflop"] == pytest.approx(4 * 9 * 64 * 210 / 1e9)
    assert rows["decode 3x40"]["gflop"] == pytest.approx(4 * 9 * 64 * 120 / 1e9)
    # this interpreter has no vLLM: its runner says so and the report keeps the reason
    assert len(report["notes"]) == 1 and "import vllm failed" in report["notes"][0]
    assert "prefill 33" in capsys.readouterr().out
    assert (tmp_path / "cpu_attention.png").is_file()
