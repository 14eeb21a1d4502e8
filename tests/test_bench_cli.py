"""``octavo bench throughput|latency|serve`` (vLLM's verbs and spellings) on the tiny
random Llama: the figures vLLM prints and writes, and the serve flags' translation."""

from __future__ import annotations

import json

from octavo.cli import main
from octavo_bench.bench_cli import serve_argv, vllm_bench_params


def test_throughput_prints_vllms_line_and_writes_its_keys(tiny_folder, tmp_path, capsys):
    out = tmp_path / "throughput.json"
    argv = ["bench", "throughput", "--model", str(tiny_folder("llama3")), "--dtype", "float32"]
    argv += ["--num-prompts", "3", "--input-len", "8", "--output-len", "4", "--disable-tqdm"]
    assert main([*argv, "--output-json", str(out)]) == 0
    assert "Throughput: " in capsys.readouterr().out
    figures = json.loads(out.read_text())
    assert figures["num_requests"] == 3 and figures["total_num_tokens"] == 3 * (8 + 4)
    assert figures["output_tokens_per_second"] > 0


def test_throughput_and_latency_sample_as_vllms_benchmarks_do():
    params = vllm_bench_params(7)  # vLLM: SamplingParams(temperature=1.0, top_p=1.0, ignore_eos)
    assert (params.temperature, params.top_p, params.max_tokens) == (1.0, 1.0, 7)
    assert params.ignore_eos and not params.is_greedy


def test_latency_prints_the_average_and_percentiles(tiny_folder, tmp_path, capsys):
    out = tmp_path / "latency.json"
    argv = ["bench", "latency", "--model", str(tiny_folder("llama3")), "--dtype", "float32"]
    argv += ["--batch-size", "2", "--input-len", "6", "--output-len", "3"]
    argv += ["--num-iters-warmup", "1", "--num-iters", "3"]
    assert main([*argv, "--output-json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Avg latency: " in printed and "99% percentile latency: " in printed
    figures = json.loads(out.read_text())
    assert len(figures["latencies"]) == 3 and figures["avg_latency"] > 0
    assert set(figures["percentiles"]) == {"10", "25", "50", "75", "90", "99"}


def test_serve_takes_vllms_spellings():
    argv = ["--host", "10.0.0.5", "--port=8001", "--random-input-len", "64", "--save-result"]
    argv += ["--random-output-len=16", "--result-dir", "out", "--num-prompts", "5"]
    assert serve_argv(argv) == [
        "--base-url",
        "http://10.0.0.5:8001",
        "--input-len",
        "64",
        "--output-len=16",
        "--output-dir",
        "out",
        "--num-prompts",
        "5",
    ]
    assert serve_argv(["--base-url", "http://h:1"]) == ["--base-url", "http://h:1"]
