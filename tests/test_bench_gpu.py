"""`python -m octavo_bench gpu`: the same code as on a GPU, run on the CPU with a tiny model
(decode vs the copy-bandwidth roofline, batch vs HF); the kernel part on a GPU only."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch

from octavo_bench import gpu

TINY = ["--device", "cpu", "--dtype", "float32", "--batch", "3", "--prompt-len", "5"]
TINY += ["--max-tokens", "8", "--max-model-len", "64", "--copy-bytes", str(1 << 20)]
TINY += ["--kv-cache-memory", str(4 << 20), "--offline-seqs", "3", "--offline-min-len", "4"]
TINY += ["--offline-max-len", "8", "--served-prompts", "2", "--served-hf-prompts", "1"]
TINY += ["--served-output-len", "8"]


def test_a_cpu_smoke_run_writes_every_figure(tiny_folder, tmp_path, capsys):
    """One mode here (on a CPU --enforce-eager changes nothing); both in the next test."""
    folder = str(tiny_folder("llama3"))  # the 8B and Qwen3 parts load it with dummy weights
    argv = [*TINY, "--model", folder, "--model-8b", folder, "--model-qwen3", folder]
    argv += ["--modes", "graphs", "--parts", ",".join(p for p in gpu.PARTS if p != "served")]
    assert gpu.main([*argv, "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu.json").read_text())
    common = result["common"]
    assert common["weight_bytes"] > 0 and common["copy_bandwidth_gb_s"] > 0
    expected_ms = 1000 * common["weight_bytes"] / (common["copy_bandwidth_gb_s"] * 1e9)
    assert common["roofline_ms_per_token"] == pytest.approx(expected_ms)
    assert common["roofline_8b_ms_per_token"] == pytest.approx(expected_ms)  # the same folder
    assert result["figures"]["eager"] == {}
    for mode in ("graphs",):
        figures = result["figures"][mode]
        assert figures["b1_fraction_of_roofline"] == pytest.approx(
            common["roofline_ms_per_token"] / figures["b1_ms_per_token"]
        )
        assert figures["b32_step_over_b1"] == pytest.approx(
            figures["b32_ms_per_step"] / figures["b1_ms_per_token"]
        )
        assert figures["b32_vs_hf"] == pytest.approx(figures["b32_tok_s"] / common["hf_b32_tok_s"])
        assert figures["b1_8b_fraction_of_roofline"] == pytest.approx(
            common["roofline_8b_ms_per_token"] / figures["b1_8b_ms_per_token"]
        )
        assert figures["offline_1b_tok_s"] > 0 and figures["offline_qwen3_tok_s"] > 0
        assert "b1_gpu_ms_per_step" not in figures  # kernel time: eager only
        assert min(figures[f"start_{name}_s"] for name in ("1b", "qwen3", "8b")) > 0
    assert result["targets"]["b32_step_over_b1"] == "<= 1.5"
    assert result["kernels"] == [] and any("need CUDA" in note for note in result["notes"])
    out = capsys.readouterr().out
    assert "graphs" in out and ">= 0.70" in out and "[gpu " in out
    assert (tmp_path / "gpu.png").stat().st_size > 0


def test_every_mode_each_part_alone_and_a_failed_part_keeps_the_others(
    tiny_folder, tmp_path, capsys
):
    """8B in every mode; Qwen3 fails (no folder); HF on random weights of a config-only
    folder (as the bench's default 1B folder)."""
    source, config_only = tiny_folder("llama3"), tmp_path / "config-only"
    config_only.mkdir()
    for path in source.iterdir():  # everything but the weights
        if path.suffix != ".safetensors":
            shutil.copy(path, config_only)
    argv = [*TINY, "--parts", "qwen3,8b,hf", "--output-dir", str(tmp_path)]
    argv += ["--model", str(config_only), "--load-format", "dummy"]
    assert gpu.main([*argv, "--model-8b", str(source), "--model-qwen3", str(tmp_path / "no")]) == 1
    result = json.loads((tmp_path / "gpu.json").read_text())
    eight_b = {"b1_8b_ms_per_token", "b1_8b_fraction_of_roofline"}
    for mode in ("graphs", "async", "eager"):
        assert f"Qwen3-0.6B {mode} failed: ValueError" in " ".join(result["notes"])
    for mode in ("graphs", "async"):  # async: graphs with --async-scheduling
        assert set(result["figures"][mode]) == {*eight_b, "start_8b_s"}
    eager = result["figures"]["eager"]
    assert set(eager) == {*eight_b, "start_8b_s", "b1_8b_gpu_ms_per_step"}
    assert eager["b1_8b_gpu_ms_per_step"] is None  # kernel time: CUDA only
    assert result["common"]["hf_b32_tok_s"] > 0 and "weight_bytes" not in result["common"]
    header = next(line for line in capsys.readouterr().out.splitlines() if "target" in line)
    assert header.split() == ["figure", "graphs", "flash", "async", "eager", "target"]
    assert "flash mode left out: FLASH_ATTN runs on CUDA GPUs only" in result["notes"]
    with pytest.raises(SystemExit):
        gpu.build_parser().parse_args(["--parts", "b1,nope"])
    args = gpu.build_parser().parse_args(["--model", str(source)])
    assert args.load_format is None  # run() makes it auto: a given folder's own checkpoint


def test_the_served_part_launches_octavo_and_the_hf_server(tiny_folder, tmp_path):
    """`octavo serve` and the naive HF server as child processes on ShareGPT-shaped
    requests (scripts/gpu-check.sh leaves this CPU run out: the GPU bench runs the part)."""
    argv = [*TINY, "--model", str(tiny_folder("llama3")), "--parts", "served"]
    assert gpu.main([*argv, "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu.json").read_text())
    served = result["figures"]["graphs"]  # the first mode's: the engine's default
    assert served["served_failed"] == 0 and served["served_hf_failed"] == 0
    assert served["served_vs_hf"] == pytest.approx(
        served["served_tok_s"] / served["served_hf_tok_s"]
    )
    assert min(served["served_ttft_p50_ms"], served["served_hf_ttft_p50_ms"]) > 0
    assert result["figures"]["eager"] == {} and result["targets"]["served_vs_hf"] == ">= 24"
    serve_report = json.loads((tmp_path / "served" / "serve.json").read_text())
    assert serve_report["settings"]["request_rate"] == served["served_request_rate"] == 20.0
    requests = serve_report["servers"]["octavo"]["levels"][0]["requests"]
    assert len(requests) == 2 and all(r["output_len"] == 8 for r in requests)
    assert len(serve_report["servers"]["hf"]["levels"][0]["requests"]) == 1
    settings = serve_report["settings"]  # the bench's device and sizes reach both servers
    expected_flags = f"--device cpu --max-model-len 2048 --kv-cache-memory {4 << 20}"
    assert settings["serve_args"] == expected_flags
    assert settings["baseline_device"] == "cpu" and settings["baseline_dtype"] == "float32"


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
        if result.flash_ms is not None:  # torch's FlashAttention-2 rows: exact as well
            assert result.flash_max_abs_diff < 2**-6 * result.max_reference, result


def test_decode_rows_report_the_kv_bandwidth():
    """GB/s is the K+V bytes a call must read over its time; the decode table shows it
    beside the times, with the split sweep (CPU: arithmetic only, no kernel runs)."""
    from octavo_bench.gpu_kernels import DecodeShape, KernelResult, decode_table

    shape = DecodeShape(32, 2048)
    assert shape.label == "32x2k"
    assert DecodeShape(32, 2048, block_size=128).label == "32x2k b128"
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
    from octavo.attention import triton_decode
    from octavo_bench import gpu_kernels

    monkeypatch.setattr(gpu_kernels, "time_ms", lambda fn, repeats=20: 1.0)
    monkeypatch.setattr(gpu_kernels, "graph_time_ms", lambda fn, repeats=20: 1.0)
    stand_in_flash_attention(monkeypatch)
    monkeypatch.setattr(gpu_kernels, "SWEEP_SPLITS", (3,))
    monkeypatch.setattr(gpu_kernels, "SWEEP_LAUNCHES", ((1, 16),))
    shape = gpu_kernels.DecodeShape(2, 48, heads=4, kv_heads=2, head_dim=16)
    single, split = gpu_kernels.decode_attention(torch.device("cpu"), torch.float32, shape)
    assert single.name == "decode 2x48 single pass"
    assert split.name == "decode 2x48 split x2 (rule: single pass)"
    for row in (single, split):
        assert row.max_rel_diff < 1e-5 and row.bytes_read == 2 * 2 * 48 * 2 * 16 * 4
    assert split.sweep_ms == {3: 1.0} and split.launch_ms == {"w1t16": 1.0}
    assert single.flash_ms is None  # one FA2 row per shape: beside the split kernel
    assert split.flash_ms == 1.0 and split.flash_max_abs_diff < 1e-5 * split.max_reference
    assert split.flash_kind == "paged"
    assert triton_decode.SPLIT_NUM_WARPS is None  # the sweep puts the default back


def test_prefill_attention_rows_on_a_tiny_shape(monkeypatch):
    """The prefill bench's code path on the CPU (the kernel under TRITON_INTERPRET, timing
    stubbed): fresh prompts and a chunk over a cached prefix agree with the torch path."""
    from octavo_bench import gpu_kernels

    monkeypatch.setattr(gpu_kernels, "graph_time_ms", lambda fn, repeats=20: 2.0)
    stand_in_flash_attention(monkeypatch, paged=False)  # torch < 2.13: contiguous keys
    monkeypatch.setattr(gpu_kernels, "PREFILL_LAUNCHES", ((4, 32),))
    small = dict(heads=4, kv_heads=2, head_dim=16)
    fresh = gpu_kernels.PrefillShape(2, 20, 20, **small)
    chunk = gpu_kernels.PrefillShape(1, 20, 48, **small)
    assert (fresh.label, chunk.label) == ("2x20", "1x20@48")
    by_hand = gpu_kernels.PrefillShape(1, 2, 3, heads=1, head_dim=1)
    assert by_hand.flop() == 4 * (2 + 3)  # queries at positions 1 and 2 see 2 and 3 keys
    for shape in (fresh, chunk):
        row = gpu_kernels.prefill_attention(torch.device("cpu"), torch.float32, shape)
        assert row.name == f"prefill {shape.label}" and row.max_rel_diff < 1e-5
        assert row.flop == shape.flop() and row.triton_tflop_s == shape.flop() / 2e9
        assert row.launch_ms == {"w4t32": 2.0}
        assert row.flash_ms == 2.0 and row.flash_max_abs_diff < 1e-5 * row.max_reference
        assert row.flash_kind == "contiguous"
    assert "w4t32:2.0000" in gpu_kernels.prefill_table([row])
    from octavo.attention.triton_kernels import prefill_attention

    query, cache, meta = gpu_kernels.prefill_inputs(chunk, torch.device("cpu"), torch.float32)
    args = (query, cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, 20, 0.25)
    default = prefill_attention(*args)
    for tile in (32, 64):  # the swept launches compute the same (a tile spans blocks)
        swept = prefill_attention(*args, kv_tile=tile, num_warps=8)
        torch.testing.assert_close(swept, default, rtol=1e-5, atol=1e-6)


def test_flash_attention_reads_the_same_keys_and_values_in_blocks_of_256():
    """The FA2 rows' cache, re-laid into 256-token blocks, gives every sequence the same
    attention as Octavo's blocks (CPU: the torch path over both layouts; the kernel itself
    needs a CUDA GPU: test_triton_kernels_match_torch_on_the_gpu)."""
    from octavo.attention.torch_ops import prefill_attention
    from octavo_bench import gpu_kernels
    from octavo_bench.gpu_flash import FLASH_BLOCK, flash_available, relay_cache

    shape = gpu_kernels.PrefillShape(3, 40, 300, heads=4, kv_heads=2, head_dim=16)
    query, cache, meta = gpu_kernels.prefill_inputs(shape, torch.device("cpu"), torch.float32)
    lengths = [300, 17, 300]  # a short sequence: its row's padding is the null block
    layout = relay_cache(cache, meta.block_tables, lengths)
    assert layout.cache.shape == (2, 3 * 2, FLASH_BLOCK, 2, 16)
    assert layout.block_tables.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert layout.cache[:, 2, 17:].abs().max() == 0  # past a sequence's end: zeros
    for i, length in enumerate(lengths):
        chunk = query[40 * i : 40 * i + min(length, 40)]
        ours = prefill_attention(chunk, cache, meta.block_tables[i], length, 0.25)
        relaid = prefill_attention(chunk, layout.cache, layout.block_tables[i], length, 0.25)
        torch.testing.assert_close(relaid, ours, rtol=0, atol=0)
    assert not flash_available(torch.device("cpu"))


def stand_in_flash_attention(monkeypatch, paged: bool = True) -> None:
    """FA2 (CUDA only) stood in for by its dense reference, as if the GPU had it: the FA2
    rows' code path runs on the CPU (``flash_reference.py``), paged as under torch 2.13 or
    over contiguous keys as under an older torch."""
    from flash_reference import dense_flash_forward, dense_varlen
    from octavo_bench import gpu_flash, gpu_kernels

    monkeypatch.setattr(gpu_kernels, "flash_available", lambda device: True)
    monkeypatch.setattr(gpu_flash, "paged_varlen_available", lambda: paged)
    monkeypatch.setattr("torch.nn.attention.varlen.varlen_attn", dense_varlen)
    monkeypatch.setattr(gpu_flash, "flash_forward", dense_flash_forward)


def test_a_launch_flash_attention_refuses_leaves_a_nan_row(monkeypatch):
    from octavo_bench import gpu_kernels

    def refuse(*args, **kw):
        raise RuntimeError("Paged KV cache block size must be divisible by 256")

    stand_in_flash_attention(monkeypatch)
    monkeypatch.setattr("torch.nn.attention.varlen.varlen_attn", refuse)
    shape = gpu_kernels.PrefillShape(1, 20, 48, heads=4, kv_heads=2, head_dim=16)
    query, cache, meta = gpu_kernels.prefill_inputs(shape, torch.device("cpu"), torch.float32)
    row = gpu_kernels.KernelResult("prefill 1x20@48", 1.0, 1.0, 0.0, 1.0, flop=shape.flop())
    refused = gpu_kernels.with_flash(row, query, cache, meta, 0.25, lambda: query)
    assert refused.flash_ms != refused.flash_ms and refused.flash_tflop_s is None  # NaN


def test_the_tables_show_flash_attention_where_it_ran():
    from octavo_bench.gpu_kernels import KernelResult, decode_table, prefill_table
    from octavo_bench.gpu_report import kernel_row

    ran = KernelResult("decode 32x2k split x5", 0.2, 0.4, 1e-3, 2.0, 10**9)
    ran = replace(ran, flash_ms=0.25, flash_max_abs_diff=2e-3, flash_kind="paged")
    assert ran.flash_gb_s == pytest.approx(4000.0)
    off_cuda = KernelResult("decode 32x2k single pass", 0.3, 0.4, 1e-3, 2.0, 10**9)
    text = decode_table([ran, off_cuda])
    assert "0.2500" in text and "2.00e-03" in text and "4000" in text and "paged" in text
    assert off_cuda.to_json()["flash_gb_s"] is None
    prefill = KernelResult("prefill 4x512", 1.0, 2.0, 0.0, 1.0, flop=10**12)
    prefill = replace(prefill, flash_ms=0.5)
    assert prefill.flash_tflop_s == 2000.0 and "2000.0" in prefill_table([prefill])
    failed = replace(off_cuda, flash_ms=float("nan"))
    assert failed.flash_gb_s is None and "nan" in decode_table([failed])
    assert kernel_row(ran.to_json())[-1] == "0.2500"
    assert kernel_row(off_cuda.to_json())[-1] == "-"


def test_the_top_kernel_table_is_per_marginal_step(capsys):
    from octavo_bench.gpu_measures import print_top_kernels

    short = {"gemv": (100.0, 4), "argmax": (10.0, 1)}
    long = {"gemv": (900.0, 36), "argmax": (90.0, 9), "rmsnorm": (40.0, 16)}
    print_top_kernels(long, short, steps=8)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["0.1000", "ms", "4.0x", "gemv"]
    assert lines[2].split() == ["0.0100", "ms", "1.0x", "argmax"]
    assert lines[3].split() == ["0.0050", "ms", "2.0x", "rmsnorm"]
    assert lines[-1].split() == ["launches", "per", "step:", "7.0"]
