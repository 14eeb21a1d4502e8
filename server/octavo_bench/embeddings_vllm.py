"""vLLM's CPU build in the embeddings benchmark: the same texts, in the same batches, on the
same folder, through ``LLM.embed`` in the vLLM venv (rerank_vllm_runner.py, task
``embed``). When the venv is missing or vLLM fails, each workload's vLLM column stays empty
and the report says why.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from octavo_bench.embedding_report import EmbeddingReport
from octavo_bench.rerank_vllm import VllmRepeats, bind_threads, run_vllm
from octavo_bench.vllm_baseline import VllmRunError, VllmSetup

MAX_MODEL_LEN = 512  # the longest passage (200 words) and BERT's position table fit


def batches_of(inputs: list[str], batch_size: int) -> list[list[str]]:
    return [inputs[i : i + batch_size] for i in range(0, len(inputs), batch_size)]


def measure_vllm(
    folder: Path,
    args: argparse.Namespace,
    runs: list[tuple[str, list[str], np.ndarray]],
    warmup: list[str],
    report: EmbeddingReport,
) -> None:
    """vLLM on every (workload, inputs, sentence-transformers' vectors) of ``runs``: its
    inputs/s and largest vector difference go into the report's workloads."""
    setup = VllmSetup.from_args(args)
    setup.dtype = args.dtype
    if setup.python is None:
        report.notes.append(f"vllm not measured: {setup.skip_reason}")
        report.vllm = setup.describe()
        return
    bind_threads(setup, args.num_threads)
    request = {
        "model": str(folder),
        "dtype": args.dtype,
        "max_model_len": MAX_MODEL_LEN,
        "task": "embed",
        "warmup": {"query": "", "documents": warmup},
        "repeats": [
            {"queries": [], "documents": batches_of(inputs, args.batch_size)}
            for _, inputs, _ in runs
        ],
    }
    try:
        ran = run_vllm(setup, request, args.output_dir / "vllm-embeddings.log")
    except VllmRunError as error:
        report.notes.append(f"vllm not measured: {error}")
        report.vllm = setup.describe()
        return
    record(report, runs, ran)
    setup.facts.update(version=ran.version, load_s=ran.load_s)
    report.vllm = setup.describe()


def record(report: EmbeddingReport, runs: list, ran: VllmRepeats) -> None:
    """vLLM's inputs/s and largest vector difference per repeat, into its workload's row."""
    workloads = {w.name: w for w in report.workloads}
    for (name, inputs, reference), seconds, batches in zip(
        runs, ran.wall_s, ran.scores, strict=True
    ):
        result = workloads[name]
        result.vllm_inputs_per_s.append(len(inputs) / seconds)
        vectors = np.asarray([vector for batch in batches for vector in batch])
        diff = float(np.abs(vectors - reference).max())
        result.vllm_max_abs_diff = max(result.vllm_max_abs_diff or 0.0, diff)
