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
