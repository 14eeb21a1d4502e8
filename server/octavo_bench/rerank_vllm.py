"""vLLM's CPU build in the rerank benchmark: ``rerank_vllm_runner.py`` in the vLLM venv.

The set-up (which python, vLLM's CPU environment) is vllm_baseline.py's; the runner is
rerank_vllm_runner.py, which scores (or embeds) the same texts on the same folder and
returns its seconds and its scores, so the report can say how far they are from
sentence-transformers'. ``--num-threads N`` binds vLLM's OpenMP threads to the first N
CPUs this process may use (the others use N threads too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from octavo_bench.vllm_baseline import VllmSetup, run_runner

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
    print(f"running vllm ({setup.python}; log: {log_path})", flush=True)
    result = run_runner(setup, request, log_path, runner=RUNNER)
    repeats = result["results"]
    return VllmRepeats(
        [r["wall_s"] for r in repeats],
        [r["scores"] for r in repeats],
        str(result.get("vllm_version")),
        round(float(result.get("load_s", 0.0)), 2),
    )
