"""The benchmarks' vLLM baseline without vLLM: its settings, and the runner's protocol run
for real (a child process) against a stand-in ``vllm`` package on PYTHONPATH."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from octavo_bench import offline, serve, vllm_baseline, vllm_runner
from octavo_bench.engine_runs import params_for
from octavo_bench.offline import BenchSetup
from octavo_bench.report import BenchReport, RunResult, save
from octavo_bench.sampling_choice import sampling_from_args
from octavo_bench.serve_launch import vllm_server_command
from octavo_bench.vllm_baseline import VllmRunError, VllmSetup
from octavo_bench.workloads import Workload

FAKE_VLLM = '''
"""A stand-in for vLLM's offline API: exactly max_tokens tokens per request, and a record
(FAKE_VLLM_RECORD) of what it was given and what the process had imported."""
import json, os, sys

__version__ = "0.0.fake"
if os.environ.get("FAKE_VLLM_MODE") == "broken":
    raise ImportError("this build has no CPU backend")


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class _Completion:
    def __init__(self, count):
        self.token_ids = list(range(count))


class _Output:
    def __init__(self, count):
        self.outputs = [_Completion(count)]


class LLM:
    def __init__(self, **kwargs):
        if os.environ.get("FAKE_VLLM_MODE") == "crash":
            raise RuntimeError("boom while loading")
        self.kwargs, self.calls, self.resets = kwargs, [], 0

    def reset_prefix_cache(self):
        self.resets += 1

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append({
            "prompts": [prompt["prompt_token_ids"] for prompt in prompts],
            "params": [p.kwargs for p in params],
            "use_tqdm": use_tqdm,
        })
        record = {
            "llm": self.kwargs,
            "calls": self.calls,
            "prefix_cache_resets": self.resets,
            "env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")},
            "octavo_modules": sorted(m for m in sys.modules if m.startswith("octavo")),
            "sys_path": sys.path,
        }
        with open(os.environ["FAKE_VLLM_RECORD"], "w") as out:
            json.dump(record, out)
        return [_Output(p.kwargs["max_tokens"]) for p in params]
'''

WORKLOADS = {
    "a": Workload("a", "2 prompts", [[1, 2, 3], [4, 5]], [3, 5]),
    "c": Workload("c", "1 stream", [[7, 8]], [4]),
}
WARMUP = [9, 10, 11]


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> Path:
    """PYTHONPATH gets a fake ``vllm``; returns the file it records its calls in."""
    package = tmp_path / "fake" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_VLLM)
    path = os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    for key in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")  # the user's setting wins
    return record


def fake_setup() -> VllmSetup:
    return VllmSetup(sys.executable, "float32", vllm_baseline.vllm_env())


def offline_run(tmp_path, vllm: VllmSetup) -> BenchReport:
    """The offline bench's vLLM step on the small workloads, after a made-up Octavo result."""
    args = argparse.Namespace(output_dir=tmp_path / "out", max_model_len=64)
    setup = BenchSetup(tmp_path / "model", None, WORKLOADS, WARMUP)
    machine = {"dtype": "float32", "cpu_count": 2, "torch_version": "x"}
    report = BenchReport(machine, {"model": "tiny"}, WORKLOADS)
    report.results.append(RunResult("octavo", "a", 2, 8, 0.5))
    offline.run_vllm_baseline(args, setup, report, list(WORKLOADS.values()), vllm)
    return report


def test_runner_runs_the_same_token_prompts_in_a_child_process(fake_vllm, tmp_path, capsys):
    report = offline_run(tmp_path, fake_setup())
    vllm_runs = [r for r in report.results if r.engine == "vllm"]
    assert [(r.workload, r.num_requests, r.output_tokens) for r in vllm_runs] == [
        ("a", 2, 8),
        ("c", 1, 4),
    ]
    assert all(r.wall_s > 0 and not r.note for r in vllm_runs)
    record = json.loads(fake_vllm.read_text())
    model = str(tmp_path / "model")
    assert record["llm"] == {"model": model, "dtype": "float32", "max_model_len": 64, "seed": 0}
    warmup, a, c = record["calls"]
    assert warmup["prompts"] == [WARMUP, WARMUP[::-1]]
    assert a["prompts"] == WORKLOADS["a"].prompts and c["prompts"] == [[7, 8]]
    assert [p["max_tokens"] for p in a["params"]] == [3, 5]
    for params in a["params"] + c["params"] + warmup["params"]:
        assert params["temperature"] == 0.0 and params["ignore_eos"] is True
        assert params["min_tokens"] == params["max_tokens"]
    assert a["use_tqdm"] is False
    # vLLM's CPU settings: defaults where unset, the user's value where set
    assert record["env"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert record["env"]["VLLM_CPU_OMP_THREADS_BIND"] == vllm_baseline.cpu_binding()
    assert record["env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    # standalone: nothing of Octavo imported, its own folder not on sys.path
    assert record["octavo_modules"] == []
    assert str(vllm_baseline.RUNNER.parent) not in record["sys_path"]
    config = report.config["vllm"]
    assert config["version"] == "0.0.fake" and config["dtype"] == "float32"
    assert config["env"]["VLLM_CPU_KVCACHE_SPACE"] == "4" and "skipped" not in config
    assert not report.notes
    # the report: the table, the ratio line, the JSON and the PNG
    entry = report.to_json()["workloads"]["a"]
    assert set(entry["results"]) == {"octavo", "vllm"}
    assert entry["ratios"]["octavo/vllm"] == pytest.approx(16.0 / (8 / vllm_runs[0].wall_s))
    capsys.readouterr()
    save(report, tmp_path / "out", "offline")
    printed = capsys.readouterr().out
    assert "vs vllm" in printed and "Octavo / vLLM (output tok/s" in printed
    assert "  (a) 16.0 / " in printed and "(c)" not in printed.split("Octavo / vLLM")[1]
    assert (tmp_path / "out" / "offline.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("broken", "import vllm failed: ImportError: this build has no CPU backend"),
        ("crash", "vLLM exited with code 1: RuntimeError: boom while loading"),
    ],
)
def test_a_failing_vllm_is_a_skip_with_its_reason(fake_vllm, tmp_path, monkeypatch, mode, reason):
    monkeypatch.setenv("FAKE_VLLM_MODE", mode)
    with pytest.raises(VllmRunError, match=reason):
        vllm_baseline.run_offline(
            fake_setup(), tmp_path, 64, [WORKLOADS["c"]], WARMUP, tmp_path / "vllm.log"
        )
    report = offline_run(tmp_path, fake_setup())
    assert [r.engine for r in report.results] == ["octavo"]
    assert len(report.notes) == 1 and report.notes[0].startswith("vllm baseline skipped: ")
    assert reason in report.notes[0] and reason in report.config["vllm"]["skipped"]
    assert (tmp_path / "out" / "offline-vllm.log").is_file()


def test_no_vllm_anywhere_is_a_skip_with_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(vllm_baseline, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(vllm_baseline, "importable_here", lambda: False)
    python, reason = vllm_baseline.find_python(None)
    assert python is None and "make vllm-venv" in reason and ".venv-vllm" in reason
    report = offline_run(tmp_path, VllmSetup(None, "float32", {}, reason))
    assert report.notes == [f"vllm baseline skipped: {reason}"]
    assert "vllm baseline skipped" in capsys.readouterr().err
    # the venv's python in the working directory is found; else this interpreter's vllm
    venv_python = tmp_path / ".venv-vllm" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    assert vllm_baseline.find_python(None) == (str(tmp_path / ".venv-vllm/bin/python"), "")
    venv_python.unlink()
    monkeypatch.setattr(vllm_baseline, "importable_here", lambda: True)
    assert vllm_baseline.find_python(None) == (sys.executable, "")


def test_a_wrong_vllm_python_fails_before_the_benchmarks_run(tmp_path):
    missing = str(tmp_path / "nope" / "python")
    assert vllm_baseline.find_python(missing) == (
        None,
        f"--vllm-python {missing} is not an executable file",
    )
    with pytest.raises(ValueError, match="is not an executable file"):
        offline.main(["--baselines", "vllm", "--vllm-python", missing])
    with pytest.raises(ValueError, match="is not an executable file"):
        serve.main(["--baseline", "vllm", "--vllm-python", missing])


def test_cpu_binding_dtype_and_env(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 6, 8, 9})
    assert vllm_baseline.cpu_binding() == "0-3,6,8-9"
    env = vllm_baseline.vllm_env({"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "8"})
    assert env == {
        "PATH": "/bin",
        "VLLM_CPU_KVCACHE_SPACE": "8",
        "VLLM_CPU_OMP_THREADS_BIND": "0-3,6,8-9",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    assert "PATH" not in vllm_baseline.vllm_settings(env)
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(vllm_baseline, "cpu_has_native_bf16", lambda native=native: native)
        assert vllm_baseline.resolve_dtype("auto") == expected
    assert vllm_baseline.resolve_dtype("float32") == "float32"


def test_vllm_server_command_line_and_serve_options():
    command = vllm_server_command("/v/bin/python", 8125, Path("/m"), "tiny", "bfloat16", 2048)
    assert command == [
        "/v/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
        "--served-model-name",
        "tiny",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        "8125",
    ]
    assert "--max-model-len" not in vllm_server_command("p", 1, "/m", "t", "float32", None)
    args = serve.build_parser().parse_args(["--baseline", "hf,vllm"])
    assert args.baseline == ["hf", "vllm"] and args.vllm_startup_timeout == 900.0
    assert args.vllm_dtype == "auto" and args.vllm_python is None
    assert serve.build_parser().parse_args([]).baseline == []
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--baseline", "tgi"])
    args = offline.build_parser().parse_args(["--baselines", "hf-fp32,vllm"])
    assert args.baselines == ["hf-fp32", "vllm"] and args.vllm_dtype == "auto"


def test_runner_usage_and_request_shape():
    result = subprocess.run(
        [sys.executable, str(vllm_baseline.RUNNER)], capture_output=True, text=True, timeout=60
    )
    assert (
        result.returncode == 2 and "usage: vllm_runner.py REQUEST.json RESULT.json" in result.stderr
    )
    request = vllm_baseline.runner_request(Path("/m"), "bfloat16", 2048, [WORKLOADS["c"]], WARMUP)
    assert json.loads(json.dumps(request)) == {
        "model": "/m",
        "dtype": "bfloat16",
        "max_model_len": 2048,
        "seed": 0,
        "warmup": {"prompts": [WARMUP, WARMUP[::-1]], "max_tokens": [8, 8]},
        "workloads": [{"name": "c", "prompts": [[7, 8]], "max_tokens": [4]}],
        "sampling": None,
    }


def test_a_sampled_run_asks_every_engine_for_the_same_draws():
    """``--temperature`` and the filters reach Octavo's requests, vLLM's runner and HF's
    ``generate`` alike; greedy stays the default."""
    args = offline.build_parser().parse_args(["--temperature", "0.8", "--top-p", "0.95"])
    sampling = sampling_from_args(args)
    assert sampling.describe() == "temperature 0.8, top_p 0.95, top_k 0, min_p 0.0"
    octavo_params = params_for(5, sampling)
    assert (octavo_params.temperature, octavo_params.top_p, octavo_params.max_tokens) == (
        0.8,
        0.95,
        5,
    )
    assert octavo_params.ignore_eos and octavo_params.seed is None
    assert sampling.hf_generate_kwargs() == {
        "do_sample": True,
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": None,
        "min_p": None,
    }
    request = vllm_baseline.runner_request(
        Path("/m"), "bfloat16", 2048, [], WARMUP, sampling.fields()
    )
    made = []
    vllm_runner.generate(FakeVllm(made), lambda **fields: fields, [{}], [3], request["sampling"])
    assert made == [
        {
            "temperature": 0.8,
            "top_p": 0.95,
            "top_k": 0,
            "min_p": 0.0,
            "max_tokens": 3,
            "min_tokens": 3,
            "ignore_eos": True,
        }
    ]
    greedy = sampling_from_args(offline.build_parser().parse_args([]))
    assert greedy.is_greedy and params_for(5, greedy).temperature == 0.0
    assert greedy.hf_generate_kwargs() == {"do_sample": False}


class FakeVllm:
    """vLLM's ``LLM.generate`` as the runner calls it: records the SamplingParams made."""

    def __init__(self, made: list) -> None:
        self.made = made

    def generate(self, inputs, params, use_tqdm):
        self.made.extend(params)
        token_ids = [[1] * p["max_tokens"] for p in params]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids)]) for ids in token_ids]
