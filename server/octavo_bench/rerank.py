"""`python -m octavo_bench rerank`: cross-encoder reranking throughput, Octavo against
sentence-transformers' ``CrossEncoder`` and vLLM's CPU build.

Each query comes with ``--documents`` documents of 20-200 words; an engine scores one
query's documents at a time (one rerank request): Octavo's offline ``LLM.score(query,
documents)``, sentence-transformers' ``CrossEncoder.predict`` in batches of
``--batch-size``, vLLM's ``LLM.score`` from its venv (vllm_baseline.py finds it; when it is
missing the report says vLLM was not measured and why). Same folder, dtype and threads.
Default model: a random ``cross-encoder-minilm`` (ms-marco-MiniLM-L-6-v2's shape) written
into a scratch folder. Each repeat draws new texts after one untimed warm-up query.
Reported: pairs/s of each engine, Octavo's ratio to each, and each engine's largest
|score - sentence-transformers' score| (scores are sigmoids, in 0..1).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from octavo import LLM
from octavo_bench.embeddings import WORDS
from octavo_bench.engine_options import add_engine_options
from octavo_bench.parsers import add_engines_option, add_output_dir, register_subcommand
from octavo_bench.report import save
from octavo_bench.rerank_models import build_encoder
from octavo_bench.rerank_report import (
    ENGINES,
    OCTAVO,
    SENTENCE_TRANSFORMERS,
    VLLM,
    EngineResult,
    RerankReport,
)
from octavo_bench.rerank_scores import octavo_scores, sentence_transformers_scores
from octavo_bench.rerank_vllm import bind_threads, run_vllm
from octavo_bench.vllm_baseline import VllmRunError, VllmSetup, add_vllm_arguments

MAX_LENGTH = 512  # tokens of a pair (BERT's position table)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="cross-encoder folder (default: random cross-encoder-minilm)"
    )
    add_engine_options(parser, {"dtype": "float32", "num_threads": None})
    parser.add_argument("--queries", type=int, default=4, help="queries per repeat")
    parser.add_argument("--documents", type=int, default=100, help="documents per query")
    parser.add_argument("--batch-size", type=int, default=32, help="CrossEncoder.predict's")
    parser.add_argument("--repeats", type=int, default=1)
    add_engines_option(parser, ENGINES)
    add_vllm_arguments(parser)
    add_output_dir(parser, "rerank")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "rerank",
        "cross-encoder rerank throughput vs sentence-transformers and vLLM",
        __doc__,
        "",
        add_arguments,
        run,
    )


def query_sets(count: int, documents: int, seed: int) -> tuple[list[str], list[list[str]]]:
    """``count`` queries of 5-15 words, each with ``documents`` documents of 20-200 words."""
    draw = random.Random(seed)
    queries = [" ".join(draw.choices(WORDS, k=draw.randint(5, 15))) for _ in range(count)]
    docs = [
        [" ".join(draw.choices(WORDS, k=draw.randint(20, 200))) for _ in range(documents)]
        for _ in range(count)
    ]
    return queries, docs


def check_sizes(args: argparse.Namespace) -> None:
    for name in ("queries", "documents", "batch_size", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")


def run(args: argparse.Namespace) -> int:
    import torch

    check_sizes(args)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.model) if args.model else build_default(Path(scratch))
        report = RerankReport(
            args.model or "random cross-encoder-minilm",
            args.dtype,
            torch.get_num_threads(),
            args.queries,
            args.documents,
            args.batch_size,
        )
        repeats = [query_sets(args.queries, args.documents, seed) for seed in range(args.repeats)]
        reference = measure_sentence_transformers(folder, args, repeats, report)
        if OCTAVO in args.engines:
            report.engines.insert(0, measure_octavo(folder, args, repeats, reference))
        if VLLM in args.engines:
            report.engines.append(measure_vllm(folder, args, repeats, reference, report))
    save(report, args.output_dir, "rerank")
    return 0


def build_default(scratch: Path) -> Path:
    print("writing a random cross-encoder-minilm (ms-marco-MiniLM-L-6-v2's shape)", flush=True)
    return build_encoder("cross-encoder-minilm", scratch / "cross-encoder-minilm")


def measure_sentence_transformers(folder, args, repeats, report) -> list[np.ndarray]:
    """CrossEncoder's scores per repeat (the reference), timed when it is an engine."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(
        str(folder),
        device="cpu",
        max_length=MAX_LENGTH,
        model_kwargs={"dtype": getattr(torch, args.dtype)},
    )
    result = EngineResult(SENTENCE_TRANSFORMERS)
    scores = timed_repeats(
        "sentence-transformers",
        lambda q, d: sentence_transformers_scores(model, q, d, args.batch_size),
        repeats,
        result,
    )
    if SENTENCE_TRANSFORMERS in args.engines:
        report.engines.append(result)
    return scores


def measure_octavo(folder, args, repeats, reference) -> EngineResult:
    llm = LLM(
        str(folder),
        runner="pooling",
        dtype=args.dtype,
        num_threads=args.num_threads,
        max_model_len=MAX_LENGTH,
    )
    result = EngineResult(OCTAVO)
    try:
        scores = timed_repeats("octavo", lambda q, d: octavo_scores(llm, q, d), repeats, result)
    finally:
        llm.shutdown()
    result.max_abs_diff = largest_difference(scores, reference)
    return result


def timed_repeats(name: str, score, repeats, result: EngineResult) -> list[np.ndarray]:
    """One untimed warm-up query, then each repeat's queries one by one; the scores."""
    queries, documents = repeats[0]
    score(queries[0], documents[0])
    all_scores = []
    for index, (queries, documents) in enumerate(repeats):
        start = time.perf_counter()
        scores = [score(q, d) for q, d in zip(queries, documents, strict=True)]
        seconds = time.perf_counter() - start
        pairs = sum(len(d) for d in documents)
        result.pairs_per_s.append(pairs / seconds)
        print(f"{name} #{index}: {pairs / seconds:.1f} pairs/s", flush=True)
        all_scores.append(np.asarray(scores, dtype=np.float64))
    return all_scores


def measure_vllm(folder, args, repeats, reference, report) -> EngineResult:
    setup = VllmSetup.from_args(args)
    setup.dtype = args.dtype
    result = EngineResult(VLLM)
    if setup.python is None:
        result.skipped = setup.skip_reason
        report.vllm = setup.describe()
        return result
    bind_threads(setup, args.num_threads)
    try:
        ran = run_vllm(setup, vllm_request(folder, args, repeats), args.output_dir / "vllm.log")
    except VllmRunError as error:
        result.skipped = str(error)
        report.vllm = setup.describe()
        return result
    result.pairs_per_s = [args.queries * args.documents / seconds for seconds in ran.wall_s]
    result.max_abs_diff = largest_difference([np.asarray(s) for s in ran.scores], reference)
    setup.facts.update(version=ran.version, load_s=ran.load_s)
    report.vllm = setup.describe()
    return result


def vllm_request(folder: Path, args, repeats) -> dict:
    queries, documents = repeats[0]
    return {
        "model": str(folder),
        "dtype": args.dtype,
        "max_model_len": MAX_LENGTH,
        "task": "score",
        "warmup": {"query": queries[0], "documents": documents[0]},
        "repeats": [{"queries": q, "documents": d} for q, d in repeats],
    }


def largest_difference(scores: list[np.ndarray], reference: list[np.ndarray]) -> float:
    pairs = zip(scores, reference, strict=True)
    return max(float(np.abs(ours - theirs).max()) for ours, theirs in pairs)
