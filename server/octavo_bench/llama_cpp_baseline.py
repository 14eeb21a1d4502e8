"""llama.cpp (llama-cpp-python) as a baseline, from its own venv (``make llama-cpp-venv``:
``.venv-llamacpp``).

llama-cpp-python is compiled for this CPU and has nothing to do with Octavo's venv, so the
benchmarks run it as a child process of its venv's python: ``run_offline`` runs
``llama_cpp_runner.py`` on a GGUF file (the embedded model's) with the same token-id
prompts Octavo gets. llama-cpp-python's ``Llama`` decodes one sequence at a time, so a
batch workload runs its requests one after another; each result says so in its note.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from octavo_bench.report import RunResult
from octavo_bench.vllm_baseline import REPO_ROOT, WARMUP_TOKENS, last_line, log_tail
from octavo_bench.workloads import Workload

LLAMA_CPP = "llama.cpp"  # the engine's label in reports
VENV_PYTHON = Path(".venv-llamacpp") / "bin" / "python"
RUNNER = Path(__file__).resolve().with_name("llama_cpp_runner.py")
RUNNER_IMPORT_FAILED = 3  # llama_cpp_runner.py's exit status when llama_cpp cannot be imported
CONTEXT_STEP = 256  # n_ctx is the longest sequence, rounded up to this
SETUP_HINT = "run `make llama-cpp-venv` (scripts/llama-cpp-venv.sh) or pass --llama-cpp-python"


class LlamaCppRunError(RuntimeError):
    """The runner failed; the message says why and ends with its log's tail."""


def find_python(explicit: str | None, repo_root: Path | None = None) -> tuple[str | None, str]:
    """The python that runs llama.cpp, or None and why not.

    ``--llama-cpp-python`` if given, else ``.venv-llamacpp/bin/python`` in the checkout.
    """
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path), ""
        return None, f"--llama-cpp-python {explicit} is not an executable file; {SETUP_HINT}"
    root = REPO_ROOT if repo_root is None else repo_root
    candidate = root / VENV_PYTHON
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate), ""
    return None, f"no llama.cpp: {candidate} is missing; {SETUP_HINT}"


def add_llama_cpp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--llama-cpp-python",
        default=None,
        help=f"python of the venv with llama-cpp-python (default: {VENV_PYTHON} in the checkout)",
    )


@dataclass
class LlamaCppSetup:
    """Which python runs the baseline (None: skipped, ``skip_reason`` says why)."""

    python: str | None
    skip_reason: str = ""
    facts: dict = field(default_factory=dict)  # what the run learnt (version, threads, ...)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LlamaCppSetup:
        python, reason = find_python(getattr(args, "llama_cpp_python", None))
        return cls(python, reason)

    @property
    def skipped(self) -> bool:
        return self.python is None

    def describe(self) -> dict:
        """The report's record of the baseline's set-up."""
        return {
            "python": self.python,
            **self.facts,
            **({"skipped": self.skip_reason} if self.skip_reason else {}),
        }


def context_size(workloads: list[Workload], warmup: list[int]) -> int:
    """n_ctx for the run: the longest prompt + new tokens, rounded up to CONTEXT_STEP."""
    longest = max(
        [len(warmup) + WARMUP_TOKENS]
        + [len(p) + n for w in workloads for p, n in zip(w.prompts, w.max_tokens, strict=True)]
    )
    return -(-longest // CONTEXT_STEP) * CONTEXT_STEP


def warmup_prompt(workloads: list[Workload]) -> list[int]:
    """The untimed warm-up's prompt: the first workload's own warm-up, else its first prompt."""
    first = workloads[0]
    return list(first.warmup_prompt or first.prompts[0])


def runner_request(gguf_path: Path, workloads: list[Workload], threads: int) -> dict:
    """What ``llama_cpp_runner.py`` reads: the GGUF, threads, and the workloads as token ids."""
    warmup = warmup_prompt(workloads)
    n_ctx = context_size(workloads, warmup)
    return {
        "model_path": str(gguf_path),
        "n_threads": threads,
        "n_ctx": n_ctx,
        "n_batch": min(n_ctx, 512),
        "seed": 0,
        "warmup": {"prompts": [warmup], "max_tokens": [WARMUP_TOKENS]},
        "workloads": [
            {"name": w.name, "prompts": w.prompts, "max_tokens": w.max_tokens} for w in workloads
        ],
    }


def parse_output(stdout: str) -> dict:
    """The runner's JSON line (its last non-blank stdout line); {} when there is none."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return {}
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {}
    return result if isinstance(result, dict) else {}


def run_runner(setup: LlamaCppSetup, request: dict, log_path: Path) -> dict:
    """``llama_cpp_runner.py`` with the venv's python; its parsed result (raises
    LlamaCppRunError). The runner's stderr, then its JSON line, go to ``log_path``."""
    if setup.python is None:
        raise LlamaCppRunError(f"llama.cpp is not set up: {setup.skip_reason}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="octavo-llamacpp-") as scratch:
        request_path = Path(scratch, "request.json")
        request_path.write_text(json.dumps(request))
        with log_path.open("wb") as log:
            completed = subprocess.run(
                [setup.python, str(RUNNER), str(request_path)],
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                check=False,
            )
    stdout = completed.stdout.decode(errors="replace")
    with log_path.open("a") as log:
        log.write(stdout)
    result = parse_output(stdout)
    code = completed.returncode
    if code == RUNNER_IMPORT_FAILED and "error" in result:
        raise LlamaCppRunError(f"{setup.python}: {result['error']}; {SETUP_HINT}")
    if code != 0 or "results" not in result:
        raise LlamaCppRunError(
            f"llama.cpp exited with code {code}: {last_line(log_path)} (log: {log_path})\n"
            f"{log_tail(log_path)}"
        )
    return result


def to_run_results(result: dict) -> list[RunResult]:
    runs = []
    for item in result["results"]:
        notes = []
        if item["num_requests"] > 1:
            notes.append(f"sequential: {item['num_requests']} requests one at a time")
        if item["output_tokens"] != item["requested_tokens"]:
            notes.append(
                f"llama.cpp made {item['output_tokens']} tokens, {item['requested_tokens']} asked"
            )
        runs.append(
            RunResult(
                LLAMA_CPP,
                item["name"],
                item["num_requests"],
                item["output_tokens"],
                item["seconds"],
                generated_tokens=item["output_tokens"],
                note="; ".join(notes),
            )
        )
    return runs


def run_offline(
    setup: LlamaCppSetup,
    gguf_path: Path,
    workloads: dict[str, Workload],
    log_path: Path,
    threads: int,
) -> list[RunResult]:
    """llama.cpp on the GGUF with the workloads' token-id prompts, in the llama.cpp venv:
    greedy, exactly each request's tokens (EOS ignored), requests one at a time."""
    if not workloads:
        return []
    request = runner_request(gguf_path, list(workloads.values()), threads)
    print(f"running llama.cpp ({setup.python}, {threads} threads; log: {log_path})", flush=True)
    start = time.perf_counter()
    result = run_runner(setup, request, log_path)  # its error carries the log's tail
    setup.facts.update(
        version=result.get("llama_cpp_version"),
        n_threads=result.get("n_threads"),
        model=str(gguf_path),
        model_bytes=result.get("model_bytes"),
        sequential=result.get("sequential", True),
        system_info=result.get("system_info", ""),
        load_s=round(result.get("load_s", 0.0), 2),
        process_s=round(time.perf_counter() - start, 2),
    )
    return to_run_results(result)
