"""octavo bench serve's ShareGPT pieces: vLLM's sampling rules, the ShareGPT-shaped file,
the /metrics peaks, and vLLM's own client (a stand-in package with vLLM's entry points)."""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import pytest

from octavo_bench import serve, serve_client, sharegpt
from octavo_bench.serve_client import Target
from octavo_bench.serve_server_stats import ServerPeaks, metric_values
from octavo_bench.serve_vllm_client import (
    CLIENT_CODE,
    ClientLoad,
    client_arguments,
    run_vllm_client,
)
from octavo_bench.serve_workload import LengthRange


def words(count: int, word: str = "day") -> str:
    return " ".join([word] * count)


def count_words(text: str) -> int:
    return len(text.split())


def write_conversations(path: Path, pairs: list[tuple[int, int]], extra: list | None = None):
    entries = [
        {"id": str(i), "conversations": [{"from": "human", "value": words(p)}, {"value": words(r)}]}
        for i, (p, r) in enumerate(pairs)
    ]
    path.write_text(json.dumps(entries + (extra or [])))
    return path


def test_sampling_follows_vllms_filter(tmp_path):
    pairs = [(10, 20), (3, 50), (10, 3), (1025, 5), (1000, 1049), (1000, 1048), (4, 4)]
    one_turn = {"id": "x", "conversations": [{"from": "human", "value": words(50)}]}
    path = write_conversations(tmp_path / "s.json", pairs, [one_turn])
    picked = sharegpt.sample_sharegpt(path, count_words, 100, seed=0)
    kept = sorted((p.input_words, p.max_tokens) for p in picked)
    assert kept == [(4, 4), (10, 20), (1000, 1048)]  # short, long and over-2048 pairs dropped
    assert all(p.input_words == count_words(p.text) for p in picked)
    fixed = sharegpt.sample_sharegpt(path, count_words, 100, seed=0, output_len=7)
    assert {p.max_tokens for p in fixed} == {7} and len(fixed) == 5  # replies' lengths unused


def test_sampling_is_seeded_and_stops_at_the_count(tmp_path):
    path = write_conversations(tmp_path / "s.json", [(5 + i, 8) for i in range(40)])
    first = sharegpt.sample_sharegpt(path, count_words, 10, seed=3)
    assert first == sharegpt.sample_sharegpt(path, count_words, 10, seed=3)
    assert first != sharegpt.sample_sharegpt(path, count_words, 10, seed=4)
    assert len(first) == 10
    with pytest.raises(ValueError, match="length filter"):
        too_short = write_conversations(tmp_path / "b.json", [(2, 2)])
        sharegpt.sample_sharegpt(too_short, count_words, 1, 0)
    (tmp_path / "bad.json").write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="JSON list"):
        sharegpt.sample_sharegpt(tmp_path / "bad.json", count_words, 1, 0)


def test_the_synthetic_file_has_sharegpts_shape(tmp_path):
    out = tmp_path / "synthetic.json"
    assert sharegpt.run(sharegpt.build_parser().parse_args([str(out), "--seed", "5"])) == 0
    entries = json.loads(out.read_text())
    assert len(entries) == 1000 and entries == sharegpt.synthesize(1000, 5)
    turns = [entry["conversations"] for entry in entries]
    assert {(t[0]["from"], t[1]["from"]) for t in turns} == {("human", "gpt")}
    prompt_mean = statistics.fmean(count_words(t[0]["value"]) for t in turns)
    reply_mean = statistics.fmean(count_words(t[1]["value"]) for t in turns)
    assert prompt_mean == pytest.approx(sharegpt.SHAREGPT_MEAN_INPUT, rel=0.15)
    assert reply_mean == pytest.approx(sharegpt.SHAREGPT_MEAN_OUTPUT, rel=0.15)
    picked = sharegpt.sample_sharegpt(out, count_words, 100, seed=0)
    assert len(picked) == 100


METRICS = """# HELP vllm:num_requests_running Requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prompt_tokens_total{model_name="m"} 1e3
"""


def test_server_peaks_keep_the_largest_values():
    assert metric_values(METRICS)["vllm:prompt_tokens_total"] == 1000.0
    peaks = ServerPeaks()
    peaks.add(METRICS)
    peaks.add(METRICS.replace(" 7.0", " 3.0").replace("0.25", "0.5"))
    assert (peaks.max_running, peaks.max_kv_cache_usage, peaks.samples) == (7, 0.5, 2)
    older = ServerPeaks()
    older.add("vllm:gpu_cache_usage_perc 0.125\n")  # vLLM's name before kv_cache_usage_perc
    assert (older.max_running, older.max_kv_cache_usage) == (None, 0.125)


def bench_args(*extra: str) -> argparse.Namespace:
    return serve.build_parser().parse_args(list(extra))


def test_vllm_client_arguments_match_the_load():
    load = ClientLoad(concurrency=8, num_prompts=20, request_rate=2.5, seed=3)
    args = bench_args("--dataset-name", "sharegpt", "--dataset-path", "/d.json")
    target = Target("http://127.0.0.1:9/v1", "m", "completions")
    command = client_arguments(args, target, "/tok", load)
    pairs = dict(itertools.pairwise(command))  # each flag -> the word after it
    assert pairs["--backend"] == "openai" and pairs["--endpoint"] == "/v1/completions"
    assert pairs["--base-url"] == "http://127.0.0.1:9" and pairs["--tokenizer"] == "/tok"
    assert (pairs["--num-prompts"], pairs["--max-concurrency"]) == ("20", "8")
    assert (pairs["--request-rate"], pairs["--seed"]) == ("2.5", "3")
    assert pairs["--dataset-name"] == "sharegpt" and pairs["--dataset-path"] == "/d.json"
    assert "--ignore-eos" in command
    args = bench_args("--input-len", "32", "--output-len", "16")
    assert args.input_len == LengthRange(32, 32)
    random = client_arguments(args, Target("http://h:1", "m", "chat"), "/tok", load)
    assert random[random.index("--backend") + 1] == "openai-chat"
    assert random[random.index("--random-input-len") + 1] == "32"
    assert random[random.index("--random-output-len") + 1] == "16"
    assert random[random.index("--temperature") + 1] == "0.0"  # greedy, as our client's


def test_sampling_flags_reach_both_clients_alike():
    """``--temperature`` and the filters go into every request of ours and onto vLLM's own
    client (which would otherwise leave the temperature to the server)."""
    args = bench_args("--temperature", "0.8", "--top-p", "0.95", "--extra-body", '{"top_k": 5}')
    body = serve_client.request_body(
        Target("http://h:1", "m"), serve.WARMUP, serve.client_options(args)
    )
    assert (body["temperature"], body["top_p"], body["min_p"], body["top_k"]) == (0.8, 0.95, 0.0, 5)
    load = ClientLoad(concurrency=1, num_prompts=4, request_rate=1.0, seed=0)
    pairs = dict(itertools.pairwise(client_arguments(args, Target("http://h:1", "m"), "/t", load)))
    assert (pairs["--temperature"], pairs["--top-p"], pairs["--top-k"]) == ("0.8", "0.95", "0")
    assert serve.client_options(bench_args()).extra_body == {"temperature": 0.0}


# A stand-in for vLLM's package: the two entry points CLIENT_CODE uses. Its "benchmark"
# records its arguments and saves a result as vLLM's does.
# output tokens per request of the run against Octavo: long enough for several /metrics
# reads (every 0.25 s); 48 took 0.26 s in all on a fast idle machine and the peak read 0
OUTPUT_LEN = 200
FAKE_ARGPARSE = "import argparse\nFlexibleArgumentParser = argparse.ArgumentParser\n"
FAKE_SERVE = """
import json, os, sys

def add_cli_args(parser):
    for flag in ("backend", "base-url", "endpoint", "model", "tokenizer", "num-prompts",
                 "max-concurrency", "request-rate", "seed", "dataset-name", "dataset-path",
                 "random-input-len", "random-output-len", "random-range-ratio",
                 "percentile-metrics", "metric-percentiles", "result-dir", "result-filename",
                 "temperature", "top-p", "top-k", "min-p"):
        parser.add_argument("--" + flag)
    for flag in ("ignore-eos", "disable-tqdm", "save-result"):
        parser.add_argument("--" + flag, action="store_true")

def main(args):
    if os.environ.get("FAKE_VLLM_FAIL"):
        sys.exit(1)
    with open(os.environ["FAKE_VLLM_RECORD"], "a") as out:
        out.write(json.dumps(vars(args)) + "\\n")
    result = {"completed": int(args.num_prompts), "output_throughput": 12.5,
              "median_ttft_ms": 40.0, "p99_ttft_ms": 90.0, "median_itl_ms": 8.0,
              "ignored": [1, 2]}
    with open(os.path.join(args.result_dir, args.result_filename), "w") as out:
        json.dump(result, out)
"""


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "fake-vllm"
    for package in ("vllm", "vllm/utils", "vllm/benchmarks"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    (root / "vllm/utils/argparse_utils.py").write_text(FAKE_ARGPARSE)
    (root / "vllm/benchmarks/serve.py").write_text(FAKE_SERVE)
    record = tmp_path / "client-record.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    return record


def test_vllm_client_runs_and_its_result_is_read(fake_vllm, tmp_path, monkeypatch):
    env = dict(__import__("os").environ)
    result = run_vllm_client(sys.executable, ["--num-prompts", "5"], env, tmp_path / "c.log")
    assert result == {
        "completed": 5,
        "output_throughput": 12.5,
        "median_ttft_ms": 40.0,
        "p99_ttft_ms": 90.0,
        "median_itl_ms": 8.0,
    }
    assert json.loads(fake_vllm.read_text())["save_result"] is True
    env["FAKE_VLLM_FAIL"] = "1"
    failed = run_vllm_client(sys.executable, [], env, tmp_path / "c.log")
    assert failed["error"].startswith("vLLM's client exited with code 1")
    assert "vllm.benchmarks.serve" in CLIENT_CODE


def test_sharegpt_needs_a_path():
    with pytest.raises(ValueError, match="--dataset-path"):
        serve.run(bench_args("--dataset-name", "sharegpt"))


def test_a_sharegpt_run_with_both_clients_against_octavo(fake_vllm, tiny_folder, tmp_path, capsys):
    """Our client on a ShareGPT file at a Poisson rate, the server's own peaks read from its
    /metrics, and vLLM's client (the stand-in) at the same load; all in the serving table."""
    from conftest import running_tiny_server

    data = write_conversations(tmp_path / "s.json", [(6 + i % 5, 4 + i % 3) for i in range(12)])
    folder = str(tiny_folder("llama3"))
    with running_tiny_server(tiny_folder, "tiny") as url:
        argv = ["--base-url", url, "--dataset-name", "sharegpt", "--dataset-path", str(data)]
        argv += ["--tokenizer", folder, "--max-concurrency", "4", "--num-prompts", "8"]
        argv += ["--request-rate", "20", "--endpoint", "completions", "--disable-tqdm"]
        argv += ["--sharegpt-output-len", str(OUTPUT_LEN)]
        argv += ["--vllm-client", "--vllm-python", sys.executable, "--output-dir", str(tmp_path)]
        assert serve.main(argv) == 0
    (level,) = json.loads((tmp_path / "serve.json").read_text())["servers"]["octavo"]["levels"]
    assert (level["completed"], level["failed"]) == (8, 0), level["errors"]
    counter = sharegpt.token_counter(folder)
    wanted = sharegpt.sample_sharegpt(data, counter, 8, serve.level_seed(0, 4))
    assert level["total_input_tokens"] == sum(p.input_words for p in wanted)
    assert level["total_output_tokens"] == 8 * OUTPUT_LEN
    assert 1 <= level["server"]["max_running"] <= 4
    assert 0 < level["server"]["max_kv_cache_usage"] <= 1
    assert level["vllm_client"]["completed"] == 8 and level["vllm_client"]["median_itl_ms"] == 8
    (sent,) = [json.loads(line) for line in fake_vllm.read_text().splitlines()]
    assert (sent["dataset_name"], sent["dataset_path"]) == ("sharegpt", str(data))
    assert (sent["request_rate"], sent["max_concurrency"], sent["model"]) == ("20.0", "4", "tiny")
    printed = capsys.readouterr().out
    assert "== serving table" in printed and "vllm client: ITL p50 ms" in printed
    assert "max batch (running)" in printed
