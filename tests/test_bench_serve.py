"""octavo bench serve: metric definitions, seeded workloads, and tiny end-to-end runs."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

import pytest

from octavo.entrypoints.openai.context import ServerConfig
from octavo_bench import serve, serve_client, vllm_baseline
from octavo_bench.serve_client import ClientOptions, Target, _Stream
from octavo_bench.serve_launch import hf_server_command, octavo_serve_command
from octavo_bench.serve_metrics import RequestRecord, level_metrics, percentile, summarize
from octavo_bench.serve_workload import (
    LengthRange,
    PromptSpec,
    arrival_times,
    build_prompts,
    parse_length,
)

from server_harness import ThreadedServer, build_local_app

MODEL = "tiny"


# ----- metrics on hand-made records ------------------------------------------------------
def hand_made_records() -> list[RequestRecord]:
    return [
        RequestRecord(True, 10, 5, ttft=0.1, latency=0.5, itls=[0.1, 0.1, 0.1, 0.1]),
        RequestRecord(True, 20, 4, ttft=0.2, latency=0.8, itls=[0.2, 0.2, 0.2]),
        RequestRecord(True, 5, 1, ttft=0.3, latency=0.3),  # one token: no TPOT
        RequestRecord(False, error="HTTP 500: boom"),
    ]


def test_percentile_interpolates_linearly():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([0.1, 0.2, 0.3], 99) == pytest.approx(0.298)
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_is_in_milliseconds_and_none_when_empty():
    summary = summarize([0.1, 0.2, 0.3, 0.4])
    assert summary.mean_ms == pytest.approx(250.0)
    assert summary.median_ms == pytest.approx(250.0)
    assert summary.p99_ms == pytest.approx(397.0)
    empty = summarize([])
    assert (empty.mean_ms, empty.median_ms, empty.p99_ms) == (None, None, None)


def test_level_metrics_on_hand_made_records():
    metrics = level_metrics(hand_made_records(), duration_s=2.0)
    assert (metrics.completed, metrics.failed) == (3, 1)
    assert (metrics.total_input_tokens, metrics.total_output_tokens) == (35, 10)
    assert metrics.request_throughput == pytest.approx(1.5)
    assert metrics.output_throughput == pytest.approx(5.0)
    assert metrics.total_token_throughput == pytest.approx(22.5)
    # TTFT over successful requests: 100, 200, 300 ms
    assert metrics.ttft.mean_ms == pytest.approx(200.0)
    assert metrics.ttft.median_ms == pytest.approx(200.0)
    assert metrics.ttft.p99_ms == pytest.approx(298.0)
    # TPOT: (0.5 - 0.1) / 4 = 100 ms and (0.8 - 0.2) / 3 = 200 ms; the 1-token one is left out
    assert metrics.tpot.mean_ms == pytest.approx(150.0)
    assert metrics.tpot.median_ms == pytest.approx(150.0)
    assert metrics.tpot.p99_ms == pytest.approx(199.0)
    # ITL pooled: four gaps of 100 ms and three of 200 ms
    assert metrics.itl.mean_ms == pytest.approx(1000.0 / 7)
    assert metrics.itl.median_ms == pytest.approx(100.0)
    assert metrics.itl.p99_ms == pytest.approx(200.0)
    # E2EL: 500, 800, 300 ms
    assert metrics.e2el.mean_ms == pytest.approx(1600.0 / 3)
    assert metrics.e2el.median_ms == pytest.approx(500.0)
    assert metrics.e2el.p99_ms == pytest.approx(794.0)


def test_all_failed_level_has_zero_throughput():
    metrics = level_metrics([RequestRecord(False, error="x")] * 3, duration_s=1.0)
    assert (metrics.completed, metrics.failed, metrics.output_throughput) == (0, 3, 0.0)
    assert metrics.ttft.median_ms is None


def test_stream_timing_and_output_len(monkeypatch):
    """TTFT and ITLs from content chunks only; output_len from usage, else chunk count."""
    clock = iter([1.25, 1.5, 2.0, 2.0, 2.0])
    monkeypatch.setattr(serve_client.time, "perf_counter", lambda: next(clock))
    state = _Stream(start=1.0)
    events = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "a"}}]},  # t = 1.25
        {"choices": [{"delta": {"content": "b"}}]},  # t = 1.5
        {"choices": [{"delta": {"content": "cd"}}]},  # t = 2.0
        {"choices": [{"delta": {}, "finish_reason": "length"}]},
    ]
    for event in events:
        assert serve_client.read_event(state, json.dumps(event), "chat")
    assert (state.ttft, state.itls, state.chunks) == (0.25, [0.25, 0.5], 3)
    prompt = PromptSpec("x y", 2, 4)
    record = serve_client.finish_record(state, prompt, level_start=0.5)
    assert (record.output_len, record.prompt_len, record.usage_reported) == (3, 2, False)
    assert record.latency == 1.0 and record.start == 0.5
    state.usage = {"prompt_tokens": 31, "completion_tokens": 4}
    record = serve_client.finish_record(state, prompt, level_start=0.5)
    assert (record.output_len, record.prompt_len, record.usage_reported) == (4, 31, True)
    assert record.tpot == pytest.approx((1.0 - 0.25) / 3)
    assert not serve_client.read_event(state, "[DONE]", "chat")


def test_error_events_and_bodies_become_messages():
    state = _Stream(start=0.0)
    event = {"error": {"message": "engine died", "type": "internal_error"}}
    assert not serve_client.read_event(state, json.dumps(event), "completions")
    assert state.error == "engine died"
    body = '{"error": {"message": "The model `x` does not exist.", "type": "x"}}'
    assert serve_client.error_message(404, body) == "HTTP 404: The model `x` does not exist."
    assert serve_client.error_message(422, '{"detail": "bad"}') == "HTTP 422: bad"
    assert serve_client.error_message(502, "Bad Gateway") == "HTTP 502: Bad Gateway"


def test_request_body_per_endpoint():
    prompt = PromptSpec("hello world", 2, 7)
    chat = serve_client.request_body(Target("http://h:1/v1/", "m"), prompt, ClientOptions())
    assert chat["messages"] == [{"role": "user", "content": "hello world"}]
    assert (chat["max_tokens"], chat["ignore_eos"], chat["stream"]) == (7, True, True)
    assert chat["stream_options"] == {"include_usage": True}
    target = Target("http://h:1/v1/", "m", "completions")
    text = serve_client.request_body(target, prompt, ClientOptions(ignore_eos=False))
    assert text["prompt"] == "hello world" and "ignore_eos" not in text
    assert target.url == "http://h:1/v1/completions"
    constrained = ClientOptions(extra_body={"guided_regex": "[a-z]+", "temperature": 0.5})
    body = serve_client.request_body(target, prompt, constrained)
    assert body["guided_regex"] == "[a-z]+" and body["temperature"] == 0.5  # extra wins


def test_extra_body_must_be_a_json_object():
    from octavo_bench.serve import json_object

    assert json_object('{"guided_json": {"type": "object"}}') == {"guided_json": {"type": "object"}}
    for bad in ("[1]", "{nope"):
        with pytest.raises(argparse.ArgumentTypeError):
            json_object(bad)


# ----- workloads --------------------------------------------------------------------------
def test_poisson_arrivals_are_seeded_with_the_right_mean():
    times = arrival_times(20_000, request_rate=4.0, seed=7)
    assert times[0] == 0.0 and times == sorted(times)
    assert times == arrival_times(20_000, 4.0, seed=7)
    assert times != arrival_times(20_000, 4.0, seed=8)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.05)  # exponential: sd = mean
    assert arrival_times(3, float("inf"), seed=1) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_times(3, 0.0, seed=1)


def test_prompts_are_seeded_and_within_ranges():
    prompts = build_prompts(50, LengthRange(3, 9), LengthRange(4, 4), seed=1)
    assert prompts == build_prompts(50, LengthRange(3, 9), LengthRange(4, 4), seed=1)
    assert prompts != build_prompts(50, LengthRange(3, 9), LengthRange(4, 4), seed=2)
    assert all(3 <= len(p.text.split()) == p.input_words <= 9 for p in prompts)
    assert {p.max_tokens for p in prompts} == {4}
    assert parse_length("64:256") == LengthRange(64, 256)
    assert parse_length("8") == LengthRange(8, 8)


def test_cli_parsing_and_launch_commands():
    args = serve.build_parser().parse_args(["--max-concurrency", "3", "--request-rate", "inf"])
    assert serve.concurrency_levels(args) == [3]
    assert len(serve.prompts_for(args, 3)) == 6
    args = serve.build_parser().parse_args(["--concurrency-sweep", "1,2,2", "--num-prompts", "3"])
    assert serve.concurrency_levels(args) == [1, 2]
    assert len(serve.prompts_for(args, 2)) == 3
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--launch", "--base-url", "http://x"])
    command = octavo_serve_command(8123, "/m", "float32", ["--max-num-seqs", "8"])
    expected = ["/m", "--host", "127.0.0.1", "--port", "8123", "--log-level", "warning"]
    expected += ["--dtype", "float32", "--max-num-seqs", "8"]
    assert command[command.index("serve") + 1 :] == expected
    assert "octavo_bench.serve_hf_server" in hf_server_command(8124, "/m", "bfloat16")


# ----- end to end on a tiny model ---------------------------------------------------------
@pytest.fixture(scope="module")
def folder(tiny_folder):
    return tiny_folder("llama3")


@pytest.fixture(scope="module")
def octavo_url(folder):
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    app = build_local_app(
        str(folder), config, max_model_len=256, kv_cache_memory=4 << 20, max_num_seqs=8
    )
    with ThreadedServer(app) as server:
        yield server.wait_ready().url


def tiny_args(url: str, out, *extra: str) -> list[str]:
    return [
        *("--base-url", url, "--concurrency-sweep", "1,2", "--num-prompts", "3"),
        *("--input-len", "6:10", "--output-len", "4", "--output-dir", str(out), "--disable-tqdm"),
        *extra,
    ]


@pytest.mark.parametrize("order", ["--one-at-a-time", "--no-one-at-a-time"])
def test_end_to_end_against_octavo_and_the_hf_baseline(octavo_url, folder, tmp_path, order):
    baseline = ("--baseline", "hf", "--baseline-model", str(folder), "--startup-timeout", "120")
    assert serve.main(tiny_args(octavo_url, tmp_path, *baseline, order)) == 0
    result = json.loads((tmp_path / "serve.json").read_text())
    assert set(result["servers"]) == {"octavo", "hf"}
    for name, server in result["servers"].items():
        assert [level["concurrency"] for level in server["levels"]] == [1, 2], name
        for level in server["levels"]:
            assert level["failed"] == 0 and level["completed"] == 3, (name, level["errors"])
            assert level["output_throughput"] > 0 and level["total_token_throughput"] > 0
            assert level["total_output_tokens"] == 12  # ignore_eos: 4 tokens each
            for request in level["requests"]:
                assert request["usage_reported"] and request["ttft"] > 0
                # tokens that reach the server's stream together go out as one chunk (as
                # vLLM's do), so a loaded machine can send a request's 4 tokens in 1 to 4
                assert 0 <= len(request["itls"]) <= 3 and request["prompt_len"] > 6
            assert level["ttft"]["median_ms"] > 0 and level["tpot"]["p99_ms"] > 0
    assert result["servers"]["octavo"]["model"] == MODEL
    versus_hf = result["comparisons"]["by_baseline"]["hf"]
    assert set(versus_hf) == {"1", "2"}
    assert all(level["output_tok_s_ratio"] > 0 for level in versus_hf.values())
    assert all(level["ttft_p50_ms"]["hf"] > 0 for level in versus_hf.values())
    assert result["settings"]["concurrency_levels"] == [1, 2]
    assert (tmp_path / "serve.png").stat().st_size > 0
    assert (tmp_path / "serve-hf.log").exists()


def test_a_server_error_is_a_failed_request_not_a_crash(octavo_url, tmp_path, capsys):
    args = tiny_args(octavo_url, tmp_path, "--model", "no-such-model", "--endpoint", "completions")
    assert serve.main(args) == 0
    result = json.loads((tmp_path / "serve.json").read_text())
    server = result["servers"]["octavo"]
    assert server["notes"] and "404" in server["notes"][0]  # the warm-up failed too
    for level in server["levels"]:
        assert (level["completed"], level["failed"], level["output_throughput"]) == (0, 3, 0.0)
        assert len(level["errors"]) == 1 and level["errors"][0].startswith("HTTP 404")
        assert "no-such-model" in level["errors"][0]
        assert all(request["error"] for request in level["requests"])
    assert "HTTP 404" in capsys.readouterr().out


# ----- the vllm baseline, with a stand-in for vLLM's server -------------------------------
FAKE_VLLM_SERVER = """
# Stands in for vLLM's OpenAI server: records its command line and environment, then
# serves the naive HF server under the name and on the port it was given.
import argparse, json, os, sys

from octavo_bench import serve_hf_server

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for flag in ("model", "served-model-name", "dtype", "max-model-len", "host", "port"):
        parser.add_argument("--" + flag)
    args = parser.parse_args()
    with open(os.environ["FAKE_VLLM_RECORD"], "w") as out:
        env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
        json.dump({"argv": sys.argv[1:], "env": env}, out)
    hf_args = [args.model, "--served-model-name", args.served_model_name, "--dtype", args.dtype]
    sys.exit(serve_hf_server.main([*hf_args, "--host", args.host, "--port", args.port]))
"""


def test_end_to_end_against_a_stand_in_vllm_server(
    octavo_url, folder, tmp_path, monkeypatch, capsys
):
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for init in (package, package.parent, package.parent.parent):
        (init / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_VLLM_SERVER)
    path = os.pathsep.join(filter(None, [str(tmp_path / "fake"), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(tmp_path / "record.json"))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    vllm = ("--baseline", "vllm", "--baseline-model", str(folder), "--vllm-dtype", "float32")
    vllm += ("--vllm-python", sys.executable, "--vllm-startup-timeout", "120")
    # --baseline-num-prompts trims only the serial hf baseline: vLLM gets every prompt
    assert serve.main(tiny_args(octavo_url, tmp_path, *vllm, "--baseline-num-prompts", "1")) == 0
    record = json.loads((tmp_path / "record.json").read_text())
    # the target's model name and max_model_len, from its /v1/models
    expected = ["--model", str(folder), "--served-model-name", MODEL, "--dtype", "float32"]
    expected += ["--max-model-len", "256", "--host", "127.0.0.1", "--port", record["argv"][-1]]
    assert record["argv"] == expected
    assert record["env"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert record["env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert record["env"]["VLLM_CPU_OMP_THREADS_BIND"] == vllm_baseline.cpu_binding()
    result = json.loads((tmp_path / "serve.json").read_text())
    assert set(result["servers"]) == {"octavo", "vllm"}
    for level in result["servers"]["vllm"]["levels"]:
        assert (level["completed"], level["failed"]) == (3, 0), level["errors"]
    assert result["servers"]["vllm"]["model"] == MODEL
    assert "cold start to healthy" in result["servers"]["vllm"]["notes"][0]
    versus = result["comparisons"]["by_baseline"]["vllm"]
    assert set(versus) == {"1", "2"} and all(v["output_tok_s_ratio"] > 0 for v in versus.values())
    settings = result["settings"]["vllm"]
    assert settings["python"] == sys.executable and settings["dtype"] == "float32"
    assert settings["max_model_len"] == 256 and settings["startup_s"] > 0
    printed = capsys.readouterr().out
    assert "== octavo / vllm per level: output tok/s, and TTFT p50 side by side ==" in printed
    assert (tmp_path / "serve-vllm.log").exists() and (tmp_path / "serve.png").stat().st_size > 0


def test_the_vllm_baseline_without_vllm_is_skipped_with_a_reason(octavo_url, tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_baseline, "find_python", lambda explicit: (None, "no vLLM: why"))
    assert serve.main(tiny_args(octavo_url, tmp_path, "--baseline", "vllm")) == 0
    result = json.loads((tmp_path / "serve.json").read_text())
    assert set(result["servers"]) == {"octavo"}
    assert result["notes"] == ["vllm baseline skipped: no vLLM: why"]
    assert result["settings"]["vllm"]["skipped"] == "no vLLM: why"
