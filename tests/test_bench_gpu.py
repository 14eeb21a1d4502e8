"""`python -m octavo_bench gpu`: the same code as on a GPU, run on the CPU with a tiny model
(decode vs the copy-bandwidth roofline, batch vs HF); the kernel part on a GPU only."""

from __future__ import annotations

import json

import pytest
import torch

from octavo_bench import gpu


def test_a_cpu_smoke_run_writes_every_figure(tiny_folder, tmp_path, capsys):
    argv = ["--model", str(tiny_folder("llama3")), "--device", "cpu", "--dtype", "float32"]
    argv += ["--batch", "3", "--prompt-len", "5", "--max-tokens", "4", "--max-model-len", "64"]
    argv += ["--copy-bytes", str(1 << 20), "--kv-cache-memory", str(4 << 20)]
    assert gpu.main([*argv, "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu.json").read_text())
    figures = result["figures"]
    assert figures["weight_bytes"] > 0 and figures["copy_bandwidth_gb_s"] > 0
    expected_ms = 1000 * figures["weight_bytes"] / (figures["copy_bandwidth_gb_s"] * 1e9)
    assert figures["roofline_ms_per_token"] == pytest.approx(expected_ms)
    assert figures["b1_fraction_of_roofline"] == pytest.approx(
        figures["roofline_ms_per_token"] / figures["b1_ms_per_token"]
    )
    assert figures["b32_tok_s"] > 0 and figures["hf_b32_tok_s"] > 0
    assert figures["b32_vs_hf"] == pytest.approx(figures["b32_tok_s"] / figures["hf_b32_tok_s"])
    assert result["kernels"] == [] and "need CUDA" in result["notes"][0]
    assert "roofline_ms_per_token" in capsys.readouterr().out
    assert (tmp_path / "gpu.png").stat().st_size > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_kernels_match_torch_on_the_gpu():
    from octavo_bench.gpu_kernels import all_kernels

    for result in all_kernels(torch.device("cuda"), torch.bfloat16):
        assert result.triton_ms > 0 and result.torch_ms > 0
        # bf16 keeps 8 significant bits: one rounding apart is 2**-8 of the output's scale
        # (SiLU(gate) * up reaches ~16, where one bf16 step is 0.0625)
        assert result.max_rel_diff < 2**-6, result
        if result.name.startswith("decode"):
            assert result.triton_gb_s > 0 and result.torch_gb_s > 0, result


def test_decode_rows_report_the_kv_bandwidth():
    """GB/s is the K+V bytes a call must read over its time; the decode table shows it
    beside the times, with the split sweep (CPU: arithmetic only, no kernel runs)."""
    from octavo_bench.gpu_kernels import DecodeShape, KernelResult, decode_table

    shape = DecodeShape(32, 2048)
    assert shape.label == "32x2k"
    assert shape.kv_bytes(torch.bfloat16) == 2 * 32 * 2048 * 8 * 128 * 2  # 268 MB
    row = KernelResult("decode 32x2k split x5", 0.1, 0.4, 1e-3, 2.0, shape.kv_bytes(torch.bfloat16))
    assert row.triton_gb_s == pytest.approx(2684.35456)
    assert row.torch_gb_s == pytest.approx(row.triton_gb_s / 4)
    swept = KernelResult("s", 0.1, 0.4, 0.0, 1.0, 10**8, sweep_ms={2: 0.2, 4: 0.1})
    assert swept.to_json()["triton_gb_s"] == pytest.approx(1000.0)
    text = decode_table([row, swept])
    assert "2684" in text and "671" in text and "2:0.2000 4:0.1000" in text
    plain = KernelResult("SiLU and mul", 0.1, 0.1, 0.0, 1.0)
    assert plain.triton_gb_s is None and plain.to_json()["sweep_ms"] is None


def test_decode_attention_rows_on_a_tiny_shape(monkeypatch):
    """The decode bench's code path on the CPU (kernels under TRITON_INTERPRET, timing
    stubbed): both rows agree with the torch path and carry their bytes and sweep."""
    from octavo_bench import gpu_kernels

    monkeypatch.setattr(gpu_kernels, "time_ms", lambda fn, repeats=20: 1.0)
    monkeypatch.setattr(gpu_kernels, "SWEEP_SPLITS", (3,))
    shape = gpu_kernels.DecodeShape(2, 48, heads=4, kv_heads=2, head_dim=16)
    single, split = gpu_kernels.decode_attention(torch.device("cpu"), torch.float32, shape)
    assert single.name == "decode 2x48 single pass"
    assert split.name == "decode 2x48 split x2 (rule: single pass)"
    for row in (single, split):
        assert row.max_rel_diff < 1e-5 and row.bytes_read == 2 * 2 * 48 * 2 * 16 * 4
    assert split.sweep_ms == {3: 1.0}
