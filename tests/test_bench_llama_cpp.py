"""The benchmarks' llama.cpp baseline without llama.cpp: its set-up, the request it sends,
the results it reads back, and the runner's protocol run for real (a child process) against
a stand-in ``llama_cpp`` package on PYTHONPATH."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from octavo_bench import llama_cpp_baseline, llama_cpp_runner
from octavo_bench.llama_cpp_baseline import LLAMA_CPP, LlamaCppRunError, LlamaCppSetup
from octavo_bench.report import RunResult
from octavo_bench.vllm_baseline import WARMUP_TOKENS
from octavo_bench.workloads import Workload

EOS = 2

FAKE_LLAMA_CPP = '''
"""A stand-in for llama-cpp-python: generate() yields EOS first and then counts up, forever
(like the real one, it never stops by itself); FAKE_LLAMA_RECORD gets what it was given."""
import json, os, sys

__version__ = "0.0.fake"
if os.environ.get("FAKE_LLAMA_MODE") == "broken":
    raise ImportError("this build has no CPU backend")


def llama_print_system_info():
    return b"CPU : FAKE = 1"


class Llama:
    def __init__(self, **kwargs):
        if os.environ.get("FAKE_LLAMA_MODE") == "crash":
            raise RuntimeError("boom while loading")
        self.kwargs, self.calls, self.resets = kwargs, [], 0

    def reset(self):
        self.resets += 1

    def generate(self, tokens, **kwargs):
        self.calls.append({"prompt": list(tokens), "kwargs": kwargs, "made": 0})
        token = 2
        while True:
            self.calls[-1]["made"] += 1
            self._record()
            yield token
            token += 1

    def _record(self):
        banned = {"octavo", "octavo_bench", "torch"}
        modules = sorted(m for m in sys.modules if m.split(".")[0] in banned)
        record = {"llm": self.kwargs, "calls": self.calls, "resets": self.resets,
                  "modules": modules}
        with open(os.environ["FAKE_LLAMA_RECORD"], "w") as f:
            json.dump(record, f)
'''


def workload(name: str, prompts: list[list[int]], tokens: int, **extra) -> Workload:
    return Workload(name, f"test {name}", prompts, [tokens] * len(prompts), **extra)


@pytest.fixture
def fake_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``llama_cpp`` stand-in on PYTHONPATH; returns the path of its record."""
    package = tmp_path / "fake" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_LLAMA_CPP)
    record = tmp_path / "record.json"
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    monkeypatch.setenv("FAKE_LLAMA_RECORD", str(record))
    monkeypatch.delenv("FAKE_LLAMA_MODE", raising=False)
    return record


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(96))
    return path


def setup_here() -> LlamaCppSetup:
    return LlamaCppSetup(sys.executable)


def test_request_carries_threads_prompts_and_a_rounded_context(gguf: Path) -> None:
    a = workload("a", [[1, 2, 3], [4, 5]], 128)
    c = workload("c", [list(range(300))], 16)
    request = llama_cpp_baseline.runner_request(gguf, [a, c], threads=2)
    assert request["model_path"] == str(gguf)
    assert request["n_threads"] == 2
    assert request["n_ctx"] == 512  # 300 + 16 rounded up to a multiple of 256
    assert request["n_batch"] == 512
    assert request["warmup"] == {"prompts": [[1, 2, 3]], "max_tokens": [WARMUP_TOKENS]}
    assert request["workloads"] == [
        {"name": "a", "prompts": [[1, 2, 3], [4, 5]], "max_tokens": [128, 128]},
        {"name": "c", "prompts": [list(range(300))], "max_tokens": [16]},
    ]
    json.dumps(request)  # what the runner reads


def test_request_warms_up_on_the_workloads_own_warmup_prompt(gguf: Path) -> None:
    d = workload("d", [[1, 2]], 4, warmup_prompt=[9, 9, 9])
    request = llama_cpp_baseline.runner_request(gguf, [d], threads=1)
    assert request["warmup"]["prompts"] == [[9, 9, 9]]
    assert request["n_ctx"] == 256


def test_results_become_run_results_noting_sequential_and_short_runs() -> None:
    result = {
        "results": [
            {
                "name": "a",
                "num_requests": 32,
                "requested_tokens": 4096,
                "output_tokens": 4096,
                "seconds": 32.0,
                "tok_s": 128.0,
                "sequential": True,
            },
            {
                "name": "c",
                "num_requests": 1,
                "requested_tokens": 128,
                "output_tokens": 100,
                "seconds": 0.5,
                "tok_s": 200.0,
                "sequential": True,
            },
        ]
    }
    a, c = llama_cpp_baseline.to_run_results(result)
    assert isinstance(a, RunResult)
    assert (a.engine, a.workload, a.num_requests, a.output_tokens) == (LLAMA_CPP, "a", 32, 4096)
    assert a.wall_s == 32.0 and a.tok_s == 128.0 and a.generated_tokens == 4096
    assert a.note == "sequential: 32 requests one at a time"
    assert c.note == "llama.cpp made 100 tokens, 128 asked"
    assert c.tok_s == 200.0


def test_parse_output_takes_the_last_json_line() -> None:
    assert llama_cpp_baseline.parse_output('noise\n{"results": []}\n\n') == {"results": []}
    assert llama_cpp_baseline.parse_output("Traceback ...\nValueError: x\n") == {}
    assert llama_cpp_baseline.parse_output("") == {}


def test_missing_venv_python_is_skipped_with_the_setup_hint(tmp_path: Path) -> None:
    python, reason = llama_cpp_baseline.find_python(None, repo_root=tmp_path)
    assert python is None
    assert ".venv-llamacpp/bin/python is missing" in reason
    assert "make llama-cpp-venv" in reason


def test_bad_explicit_python_is_skipped_with_a_reason(tmp_path: Path) -> None:
    python, reason = llama_cpp_baseline.find_python(str(tmp_path / "nope"))
    assert python is None
    assert "--llama-cpp-python" in reason and "not an executable file" in reason


def test_setup_finds_the_checkouts_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = tmp_path / ".venv-llamacpp" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setattr(llama_cpp_baseline, "REPO_ROOT", tmp_path)
    parser = argparse.ArgumentParser()
    llama_cpp_baseline.add_llama_cpp_arguments(parser)
    setup = LlamaCppSetup.from_args(parser.parse_args([]))
    assert setup.python == str(python) and not setup.skipped
    assert setup.describe() == {"python": str(python)}
    missing = LlamaCppSetup.from_args(parser.parse_args(["--llama-cpp-python", "/no/python"]))
    assert missing.skipped and missing.describe()["skipped"] == missing.skip_reason


def test_generate_one_stops_at_the_count_not_at_eos() -> None:
    class Llm:
        def __init__(self) -> None:
            self.resets = 0
            self.kwargs: dict = {}

        def reset(self) -> None:
            self.resets += 1

        def generate(self, tokens, **kwargs):
            self.kwargs = kwargs
            while True:
                yield EOS

    llm = Llm()
    assert llama_cpp_runner.generate_one(llm, [1, 2], 5) == 5
    assert llm.resets == 1
    assert llm.kwargs["temp"] == 0.0 and llm.kwargs["repeat_penalty"] == 1.0
    assert llama_cpp_runner.generate(llm, [[1], [2], [3]], [3, 4, 0]) == 7


def test_run_offline_through_the_runner(
    fake_llama: Path, gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workloads = {
        "c": workload("c", [[5, 6, 7]], 6),
        "a": workload("a", [[1, 2], [3, 4], [5]], 4),
    }
    setup = setup_here()
    log = tmp_path / "logs" / "llama.log"
    runs = llama_cpp_baseline.run_offline(setup, gguf, workloads, log, threads=2)
    assert [(r.engine, r.workload, r.num_requests, r.output_tokens) for r in runs] == [
        (LLAMA_CPP, "c", 1, 6),
        (LLAMA_CPP, "a", 3, 12),
    ]
    assert all(r.wall_s > 0 for r in runs)
    assert runs[1].note == "sequential: 3 requests one at a time"
    record = json.loads(fake_llama.read_text())
    assert record["modules"] == []  # the runner imports nothing of Octavo, nor torch
    llm = record["llm"]
    assert llm["model_path"] == str(gguf)
    assert (llm["n_threads"], llm["n_threads_batch"]) == (2, 2)
    assert (llm["logits_all"], llm["verbose"], llm["n_ctx"]) == (False, False, 256)
    # The warm-up, then every prompt alone from an empty cache, each to its exact count.
    assert [(c["prompt"], c["made"]) for c in record["calls"]] == [
        ([5, 6, 7], WARMUP_TOKENS),
        ([5, 6, 7], 6),
        ([1, 2], 4),
        ([3, 4], 4),
        ([5], 4),
    ]
    assert record["resets"] == 5
    assert setup.facts["version"] == "0.0.fake"
    assert setup.facts["n_threads"] == 2 and setup.facts["model_bytes"] == 100
    assert setup.facts["sequential"] is True and setup.facts["system_info"] == "CPU : FAKE = 1"
    assert '"results"' in log.read_text()
    assert "running llama.cpp" in capsys.readouterr().out


def test_unimportable_llama_cpp_names_the_setup_hint(
    fake_llama: Path, gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_MODE", "broken")
    workloads = {"c": workload("c", [[1]], 2)}
    with pytest.raises(LlamaCppRunError, match=r"import llama_cpp failed.*make llama-cpp-venv"):
        llama_cpp_baseline.run_offline(setup_here(), gguf, workloads, tmp_path / "l.log", 1)


def test_crashing_runner_raises_with_the_log_tail(
    fake_llama: Path, gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_MODE", "crash")
    log = tmp_path / "crash.log"
    with pytest.raises(LlamaCppRunError) as raised:
        llama_cpp_baseline.run_offline(setup_here(), gguf, {"c": workload("c", [[1]], 2)}, log, 1)
    message = str(raised.value)
    assert "exited with code 1" in message and str(log) in message
    assert "RuntimeError: boom while loading" in message
    assert 'raise RuntimeError("boom while loading")' in message  # the tail, not one line


def test_failing_runner_script_raises_naming_its_log_tail(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = tmp_path / "failing_runner.py"
    runner.write_text(
        "import sys\n"
        "for i in range(30):\n"
        "    print(f'line {i}', file=sys.stderr)\n"
        "print('not json')\n"
        "sys.exit(7)\n"
    )
    monkeypatch.setattr(llama_cpp_baseline, "RUNNER", runner)
    log = tmp_path / "fail.log"
    with pytest.raises(LlamaCppRunError) as raised:
        llama_cpp_baseline.run_offline(setup_here(), gguf, {"c": workload("c", [[1]], 2)}, log, 1)
    message = str(raised.value)
    assert "exited with code 7: not json" in message
    assert "line 29" in message and "line 20" in message
    assert "line 0\n" not in message  # only the tail


def test_run_without_a_python_raises_the_skip_reason(gguf: Path, tmp_path: Path) -> None:
    setup = LlamaCppSetup(None, "no llama.cpp: run `make llama-cpp-venv`")
    with pytest.raises(LlamaCppRunError, match="make llama-cpp-venv"):
        llama_cpp_baseline.run_offline(setup, gguf, {"c": workload("c", [[1]], 2)}, tmp_path, 1)
