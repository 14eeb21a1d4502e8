"""``python -m octavo_bench structured``: a tiny run writes tok/s per mode, the overheads and
the large schema's compile times; the large schema compiles to a valid grammar."""

from __future__ import annotations

import json

from octavo_bench.cli import main
from octavo_bench.structured import large_schema


def test_a_tiny_run_reports_overheads_and_compile_times(tiny_folder, tmp_path):
    code = main(
        [
            "structured",
            "--model",
            str(tiny_folder("llama3")),
            "--dtype",
            "float32",
            "--concurrency",
            "3",
            "--output-len",
            "8",
            "--repeats",
            "1",
            "--schema-properties",
            "20",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "structured.json").read_text())
    assert set(report["tokens_per_s"]) == {"unconstrained", "json-schema", "json-schema-maxlength"}
    assert all(rate[0] > 0 for rate in report["tokens_per_s"].values())
    assert set(report["overhead"]) == {"json-schema", "json-schema-maxlength"}
    first, cached = report["compile_s"].values()
    assert first > 0 and cached == 0.0
    assert (tmp_path / "structured.png").stat().st_size > 0


def test_the_large_schema_has_the_requested_fields():
    schema = large_schema(7)
    assert len(schema["properties"]) == 7 and schema["required"] == list(schema["properties"])
