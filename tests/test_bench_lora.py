"""``python -m octavo_bench lora``: a tiny run of the base model, LoRA enabled without
adapters, and users spread over 1 and 2 adapters that writes the JSON (medians, TPOT,
ratios to base, the 4-adapter target) and the PNG; bad adapter counts are refused."""

from __future__ import annotations

import json

import pytest

from octavo_bench.cli import main
from octavo_bench.lora import parse_counts


def test_a_tiny_run_reports_tok_s_tpot_and_ratios(tiny_folder, tmp_path):
    code = main(
        [
            "lora",
            "--model",
            str(tiny_folder("llama3")),
            "--num-users",
            "3",
            "--max-tokens",
            "6",
            "--prompt-tokens",
            "40",
            "--adapter-counts",
            "1,2",
            "--rank",
            "4",
            "--repeats",
            "1",
            "--dtype",
            "float32",
            "--kv-cache-memory",
            str(2**24),
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "lora.json").read_text())
    runs = {run["variant"]: run for run in report["runs"]}
    assert list(runs) == ["base", "base+lora", "1 adapter", "2 adapters"]
    assert [runs[name]["adapters"] for name in runs] == [0, 0, 1, 2]
    assert [runs[name]["enable_lora"] for name in runs] == [False, True, True, True]
    for run in runs.values():
        assert run["output_tokens"] == 3 * 6 and run["peak_running"] == 3
        assert run["median_tok_s"] > 0 and len(run["tok_s"]) == 1
        assert run["median_tpot_ms"] > 0 and run["vs_base"] > 0
    assert runs["base"]["vs_base"] == 1.0
    two, base = runs["2 adapters"], runs["base"]
    assert two["vs_base"] == pytest.approx(two["median_tok_s"] / base["median_tok_s"])
    assert report["target"] == {
        "variant": "4 adapters",
        "minimum_vs_base": 0.8,
        "vs_base": None,
        "met": None,
    }
    assert report["settings"]["adapter_counts"] == [1, 2]
    assert (tmp_path / "lora.png").stat().st_size > 0


def test_adapter_counts_are_parsed_and_bad_ones_refused(tmp_path, capsys):
    assert parse_counts("1, 4,16,4") == [1, 4, 16]
    for bad in ("0,4", "a", ""):
        with pytest.raises(ValueError, match="--adapter-counts"):
            parse_counts(bad)
    assert main(["lora", "--adapter-counts", "1,x", "--output-dir", str(tmp_path)]) == 2
    assert "--adapter-counts '1,x'" in capsys.readouterr().err
