"""``python -m octavo_bench speculative``: a tiny run with and without n-gram speculation
and the HF baselines that writes the JSON (ratios to ``off``, acceptance) and the PNG."""

from __future__ import annotations

import json

from octavo_bench.cli import main


def test_a_tiny_run_reports_ratios_and_acceptance(tiny_folder, tmp_path):
    """The tiny random Llama: the run's plumbing, not SmolLM2's speed, is under test."""
    code = main(
        [
            "speculative",
            "--model",
            str(tiny_folder("llama3")),
            "--variants",
            "off,ngram",
            "--single",
            "1",
            "--users",
            "2",
            "--max-tokens",
            "12",
            "--dtype",
            "float32",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "speculative.json").read_text())
    assert report["model"] == tiny_folder("llama3").name
    runs = {(r["variant"], r["workload"], r["users"]): r for r in report["runs"]}
    engines = {(v, w, u) for v in ("off", "ngram") for w in ("grounded", "free") for u in (1, 2)}
    hf = {(v, w, 1) for v in ("hf", "hf prompt lookup") for w in ("grounded", "free")}
    assert set(runs) == engines | hf
    assert all(run["tok_s"] > 0 and run["output_tokens"] > 0 for run in runs.values())
    assert (
        runs["off", "free", 2]["vs_off"] == 1.0
        and runs["off", "free", 2]["acceptance_rate"] is None
    )
    grounded = runs["ngram", "grounded", 1]
    assert grounded["acceptance_rate"] > 0 and grounded["mean_accepted_length"] > 1
    assert (tmp_path / "speculative.png").stat().st_size > 0


def test_an_unknown_variant_is_refused(tmp_path, capsys):
    assert main(["speculative", "--variants", "off,eagle", "--output-dir", str(tmp_path)]) == 2
    assert "unknown variants ['eagle']" in capsys.readouterr().err
