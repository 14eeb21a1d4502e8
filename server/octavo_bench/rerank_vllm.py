"""vLLM's CPU build in the rerank benchmark: ``rerank_vllm_runner.py`` in the vLLM venv.

The set-up (which python, vLLM's CPU environment) is vllm_baseline.py's; the runner is
rerank_vllm_runner.py, which scores (or embeds) the same texts on the same folder and
returns its seconds and its scores, so the report can say how far they are from
sentence-transformers'. ``--num-threads N`` binds vLLM's OpenMP threads to the first N
CPUs this process may use (the others use N threads too).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from octavo_bench.vllm_baseline import (
    RUNNER_IMPORT_FAILED,
    SETUP_HINT,
    VllmRunError,
    VllmSetup,
    last_line,
)

RUNNER = Path(__file__).resolve().with_name("rerank_vllm_runner.py")


@dataclass
class VllmRepeats:
    """vLLM's seconds and scores (or vectors) per repeat, and its version and load time."""

    wall_s: list[float]
    scores: list[list]
    version: str
    load_s: float


def bind_threads(setup: VllmSetup, num_threads: int | None) -> None:
    """Bind vLLM's OpenMP threads to the first ``num_threads`` usable CPUs (unless the user
    set VLLM_CPU_OMP_THREADS_BIND)."""
    if not num_threads or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cpus = sorted(os.sched_getaffinity(0))[:num_threads]
    setup.env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(cpu) for cpu in cpus)


def run_vllm(setup: VllmSetup, request: dict, log_path: Path) -> VllmRepeats:
    """The runner with the vLLM python on ``request`` (rerank_vllm_runner.py's format)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="octavo-vllm-rerank-") as scratch:
        request_path, result_path = Path(scratch, "request.json"), Path(scratch, "result.json")
        request_path.write_text(json.dumps(request))
        command = [str(setup.python), str(RUNNER), str(request_path), str(result_path)]
        print(f"running vllm ({setup.python}; log: {log_path})", flush=True)
        with log_path.open("wb") as log:
            code = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=setup.env, check=False
            ).returncode
        result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if code == RUNNER_IMPORT_FAILED and "error" in result:
        raise VllmRunError(f"{setup.python}: {result['error']}; {SETUP_HINT}")
    if code != 0 or "results" not in result:
        raise VllmRunError(f"vLLM exited with code {code}: {last_line(log_path)} (log: {log_path})")
    repeats = result["results"]
    return VllmRepeats(
        [r["wall_s"] for r in repeats],
        [r["scores"] for r in repeats],
        str(result.get("vllm_version")),
        round(float(result.get("load_s", 0.0)), 2),
    )
