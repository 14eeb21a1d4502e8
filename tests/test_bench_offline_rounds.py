"""`offline --rounds N`: Octavo and vLLM take turns workload by workload (vllm_turns, the
runner's protocol run for real against the stand-in ``vllm`` of test_bench_vllm); each
workload's ratio is the median of the rounds' paired ratios, each engine's row its median
run (offline_rounds)."""

from __future__ import annotations

import argparse
import json

import pytest

from octavo_bench import offline
from octavo_bench.offline import BenchSetup
from octavo_bench.offline_rounds import Rounds
from octavo_bench.report import BenchReport, RunResult, save
from octavo_bench.vllm_baseline import VllmRunError, runner_request
from octavo_bench.vllm_turns import VllmTurns
from octavo_bench.workloads import Workload
from test_bench_vllm import fake_setup, fake_vllm  # noqa: F401 (the fixture below uses it)

WORKLOADS = {
    "b": Workload("b", "2 prompts", [[1, 2, 3], [4, 5]], [3, 5]),
    "c": Workload("c", "1 stream", [[7, 8]], [4]),
    "d": Workload("d", "shared prefix", [[6, 7]], [2]),
}
MACHINE = {"dtype": "bfloat16", "cpu_count": 2, "torch_version": "x"}


@pytest.fixture
def vllm_record(fake_vllm):  # noqa: F811 (test_bench_vllm's stand-in vllm on PYTHONPATH)
    """The file the stand-in vllm records its calls in."""
    return fake_vllm


def run(engine: str, wall_s: float, workload: str = "b") -> RunResult:
    return RunResult(engine, workload, 2, 100, wall_s)  # 100 tokens: tok/s = 100 / wall_s


def test_the_ratio_is_the_median_of_paired_rounds_and_rows_the_median_runs(tmp_path, capsys):
    report = BenchReport(MACHINE, {"model": "tiny"}, WORKLOADS)
    report.results += [run("octavo", 4.0), run("octavo", 2.0, "d")]  # the first, unpaired run
    rounds = Rounds(["b"])
    # the machine slows down, then recovers: each pair's runs are of the same minutes
    for octavo_s, vllm_s in ((1.0, 2.0), (2.0, 2.2), (1.0, 1.25)):
        rounds.add(run("octavo", octavo_s))
        rounds.add(run("vllm", vllm_s))
    rounds.settle(report)
    assert rounds.paired_ratios("b", "vllm") == pytest.approx([2.0, 1.1, 1.25])
    assert report.result("b", "octavo").tok_s == pytest.approx(100.0)  # of 100, 50, 100
    assert report.result("b", "vllm").tok_s == pytest.approx(50.0)  # of 50, 45.5, 80
    assert report.result("d", "octavo").wall_s == 2.0  # not in the rounds: as it was
    entry = report.to_json()["workloads"]["b"]
    assert entry["ratios"]["octavo/vllm"] == pytest.approx(1.25)  # not 100 / 50
    assert entry["rounds"]["tok_s"] == {"octavo": [100.0, 50.0, 100.0], "vllm": [50.0, 45.45, 80.0]}
    assert entry["rounds"]["ratios"]["octavo/vllm"] == pytest.approx([2.0, 1.1, 1.25])
    assert "rounds" not in report.to_json()["workloads"]["d"]
    save(report, tmp_path, "offline")
    printed = capsys.readouterr().out
    assert "(b) vs vllm: 2.00x 1.10x 1.25x -> 1.25x" in printed
    assert "(b) 100.0 / 50.0 tok/s = 1.25x" in printed
    assert json.loads((tmp_path / "offline.json").read_text())["workloads"]["b"]["rounds"]


def test_octavo_and_vllm_take_turns_workload_by_workload(vllm_record, tmp_path, monkeypatch):
    """Octavo's k-th run finds vLLM's runner past exactly its warm-up and k - 1 turns."""
    seen: list[str] = []

    def octavo_run(llm, workload, label, sampling):
        record = json.loads(vllm_record.read_text())
        runs, resets = len(record["calls"]) - 1, record["prefix_cache_resets"]
        seen.append(f"{workload.name} after {runs} vllm runs, {resets} cache resets")
        return run("octavo", 1.0, workload.name)

    fits = []
    monkeypatch.setattr(offline, "make_llm", lambda args, prefix_caching: "rounds' engine")
    monkeypatch.setattr(offline, "warm_up", lambda llm, prompt: None)
    monkeypatch.setattr(offline, "run_workload", octavo_run)
    monkeypatch.setattr(
        offline, "add_fit", lambda report, llm, w, budget: fits.append((llm, w.name))
    )
    args = argparse.Namespace(
        rounds=2, max_model_len=64, output_dir=tmp_path / "out", kv_cache_memory=1 << 20
    )
    setup = BenchSetup(tmp_path / "model", None, WORKLOADS, [9, 10])
    report = BenchReport(MACHINE, {"model": "tiny"}, WORKLOADS)
    vllm = fake_setup()
    offline.run_rounds(args, setup, report, vllm)
    assert fits == [("rounds' engine", "b")]  # (b)'s KV figures: from the rounds' engine
    # each vLLM turn starts with an empty prefix cache: the rounds repeat the prompts
    expected = [f"{name} after {k} vllm runs, {k} cache resets" for k, name in enumerate("bcbc")]
    assert seen == expected
    assert [len(report.rounds.runs[(name, "vllm")]) for name in "bc"] == [2, 2]
    assert ("d", "vllm") not in report.rounds.runs  # (d) is not a vLLM workload
    assert report.result("c", "vllm").output_tokens == 4
    assert vllm.facts["version"] == "0.0.fake" and not vllm.skip_reason


def test_a_vllm_that_fails_to_start_is_a_skip_note(vllm_record, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    monkeypatch.setattr(offline, "make_llm", lambda args, prefix_caching: None)
    monkeypatch.setattr(offline, "warm_up", lambda llm, prompt: None)
    monkeypatch.setattr(offline, "run_workload", lambda *a: run("octavo", 1.0, a[1].name))
    monkeypatch.setattr(offline, "add_fit", lambda *a: None)
    args = argparse.Namespace(
        rounds=2, max_model_len=64, output_dir=tmp_path / "out", kv_cache_memory=1 << 20
    )
    report = BenchReport(MACHINE, {"model": "tiny"}, WORKLOADS)
    offline.run_rounds(args, BenchSetup(tmp_path, None, WORKLOADS, [9]), report, fake_setup())
    assert any(
        "vllm baseline skipped" in note and "boom while loading" in note for note in report.notes
    )
    assert "skipped" in report.config["vllm"]
    # vLLM never became ready: no turn was taken, and Octavo ran its rounds alone
    assert set(report.rounds.runs) == {("b", "octavo"), ("c", "octavo")}
    assert [len(runs) for runs in report.rounds.runs.values()] == [2, 2]
    assert report.result("b", "octavo") is not None


def test_a_runner_that_dies_is_an_error_with_its_last_line(vllm_record, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    request = runner_request(tmp_path, "float32", 64, list(WORKLOADS.values()), [9, 10])
    with (
        pytest.raises(VllmRunError, match="RuntimeError: boom while loading"),
        VllmTurns(fake_setup(), request, tmp_path / "vllm.log"),
    ):
        pass


def test_the_rounds_workloads_get_no_unpaired_run_first(tmp_path, monkeypatch):
    """With --rounds, Octavo's single pass runs only what the rounds do not: (d), on its two
    engines (prefix caching off, then on)."""
    ran = []

    def octavo_run(llm, workload, label, sampling):
        ran.append((workload.name, label))
        return run(label, 1.0, workload.name)

    monkeypatch.setattr(offline, "make_llm", lambda args, prefix_caching: None)
    monkeypatch.setattr(offline, "warm_up", lambda llm, prompt: None)
    monkeypatch.setattr(offline, "run_workload", octavo_run)
    monkeypatch.setattr(offline, "sampling_from_args", lambda args: None)
    setup = BenchSetup(tmp_path, None, WORKLOADS, [9])
    report = BenchReport(MACHINE, {"model": "tiny"}, WORKLOADS)
    args = argparse.Namespace(rounds=3)
    offline.run_octavo(args, setup, report, skip=set(offline.rounds_workloads(setup)))
    assert ran == [("d", "octavo-no-prefix-cache"), ("d", "octavo")]
    ran.clear()
    offline.run_octavo(args, setup, report, skip={"b", "c", "d"})
    assert ran == []  # nothing left: no engine is even loaded
