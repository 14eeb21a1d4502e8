"""``python -m octavo_bench quantized``: a tiny run of bf16 against GGUF kept quantized and
int8 that writes the JSON (ratios to bf16, weight bytes, KV blocks) and the PNG; llama.cpp
without its venv is reported as skipped, with the reason."""

from __future__ import annotations

import json

from octavo_bench.cli import main


def test_a_tiny_run_reports_ratios_and_footprints(tmp_path):
    code = main(
        [
            "quantized",
            "--variants",
            "bf16,gguf,int8,llama.cpp",
            "--scale",
            "0.03",
            "--repeats",
            "1",
            "--dtype",
            "float32",
            "--kv-cache-memory",
            str(2**26),
            "--llama-cpp-python",
            str(tmp_path / "missing-python"),
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "quantized.json").read_text())
    runs = {(run["variant"], run["workload"]): run for run in report["runs"]}
    assert set(runs) == {(v, w) for v in ("bf16", "gguf", "int8") for w in ("a", "c")}
    assert all(run["median"] > 0 and len(run["tokens_per_s"]) == 1 for run in runs.values())
    assert runs["bf16", "c"]["vs_bf16"] == 1.0
    assert runs["gguf", "a"]["weight_bytes"] < 0.4 * runs["bf16", "a"]["weight_bytes"]
    assert runs["gguf", "a"]["kv_blocks"] == runs["bf16", "a"]["kv_blocks"]  # same KV budget
    assert any(note.startswith("llama.cpp skipped") for note in report["notes"])
    assert (tmp_path / "quantized.png").stat().st_size > 0


def test_an_unknown_variant_is_refused(tmp_path, capsys):
    assert main(["quantized", "--variants", "bf16,nf4", "--output-dir", str(tmp_path)]) == 2
    assert "unknown variants ['nf4']" in capsys.readouterr().err
