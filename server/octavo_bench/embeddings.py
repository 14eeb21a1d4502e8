"""`python -m octavo_bench embeddings`: embedding throughput against sentence-transformers.

The same model folder runs in Octavo's pooling runner (``LLM.embed``) and in
sentence-transformers (``SentenceTransformer.encode``), one after the other in this run,
same dtype and threads, inputs in batches of ``--batch-size`` (one ``/v1/embeddings``
request of that many inputs, or one ``encode`` batch). Default model: the embedded
SmolLM2-135M read as a decoder embedding model (last-token pooling, normalised, as
Qwen3-Embedding is), written as a sentence-transformers folder of links. Two workloads:
``passages`` (distinct texts of 20-200 words) and ``queries`` (Qwen3-Embedding's
instruction prefix before each short query, the retrieval case; Octavo's prefix cache
keeps the shared instruction). Each repeat draws new texts (no cache carried between
repeats). Reported: inputs/s of each, the ratio, and the largest difference between the
two engines' vectors. vLLM's CPU build, when its venv is there (vllm_baseline.py), embeds the
same batches in ``LLM.embed`` (embeddings_vllm.py): its inputs/s, Octavo's ratio to it and
its vectors' difference from sentence-transformers'; else the report says why it is missing.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from octavo import LLM
from octavo_bench.embedding_report import EmbeddingReport, WorkloadResult
from octavo_bench.embeddings_vllm import measure_vllm
from octavo_bench.engine_options import add_engine_options, default_dtype
from octavo_bench.parsers import add_output_dir, register_subcommand
from octavo_bench.report import save
from octavo_bench.vllm_baseline import add_vllm_arguments

INSTRUCTION = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
)
_SENTENCE = (
    "the model serves requests across replicas while the cache keeps shared prefixes of "
    "prompts in memory so that retrieval pipelines embed passages and queries quickly on "
    "every machine from small laptops to large clusters with accelerators and plain CPUs"
)
WORDS = _SENTENCE.split(" ")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2)")
    add_engine_options(parser, {"dtype": default_dtype(), "num_threads": None})
    parser.add_argument("--num-inputs", type=int, default=256, help="inputs per repeat")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-vllm", dest="vllm", action="store_false", help="skip vLLM's CPU build"
    )
    add_vllm_arguments(parser)
    add_output_dir(parser, "embeddings")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "embeddings",
        "embedding throughput vs sentence-transformers",
        __doc__,
        "",
        add_arguments,
        run,
    )


def texts(workload: str, count: int, seed: int) -> list[str]:
    draw = random.Random(seed)
    if workload == "queries":
        return [
            INSTRUCTION + " ".join(draw.choices(WORDS, k=draw.randint(5, 15))) for _ in range(count)
        ]
    return [" ".join(draw.choices(WORDS, k=draw.randint(20, 200))) for _ in range(count)]


def run(args: argparse.Namespace) -> int:
    import torch
    from sentence_transformers import SentenceTransformer

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    with tempfile.TemporaryDirectory() as scratch:
        folder = sentence_transformers_folder(args.model, Path(scratch))
        llm = LLM(str(folder), runner="pooling", dtype=args.dtype, num_threads=args.num_threads)
        reference = SentenceTransformer(
            str(folder), device="cpu", model_kwargs={"dtype": getattr(torch, args.dtype)}
        )
        report = EmbeddingReport(
            args.model or "SmolLM2-135M-Instruct",
            args.dtype,
            args.batch_size,
            torch.get_num_threads(),
        )
        runs = []  # (workload, inputs, sentence-transformers' vectors) per repeat
        for workload in ("passages", "queries"):
            report.workloads.append(measure(workload, llm, reference, args, runs))
        llm.shutdown()
        if args.vllm:
            warmup = texts("passages", args.batch_size, 999)
            measure_vllm(folder, args, runs, warmup, report)
    save(report, args.output_dir, "embeddings")
    return 0


def measure(workload: str, llm: LLM, reference, args, runs: list) -> WorkloadResult:
    result = WorkloadResult(workload)
    embed_batches(llm, reference, texts(workload, args.batch_size, 999), args.batch_size)
    for repeat in range(args.repeats):
        inputs = texts(workload, args.num_inputs, repeat)
        octavo_s, st_s, ours, theirs = embed_batches(llm, reference, inputs, args.batch_size)
        result.octavo_inputs_per_s.append(len(inputs) / octavo_s)
        result.st_inputs_per_s.append(len(inputs) / st_s)
        result.max_abs_diff = max(result.max_abs_diff, float(np.abs(ours - theirs).max()))
        runs.append((workload, inputs, theirs))
        result.tokens = sum(len(llm.get_tokenizer().encode(t)) for t in inputs)
        print(
            f"{workload} #{repeat}: octavo {len(inputs) / octavo_s:.1f} inputs/s, "
            f"sentence-transformers {len(inputs) / st_s:.1f} inputs/s"
        )
    return result


def embed_batches(llm: LLM, reference, inputs: list[str], batch_size: int):
    """(Octavo's seconds, sentence-transformers' seconds, both engines' vectors)."""
    batches = [inputs[i : i + batch_size] for i in range(0, len(inputs), batch_size)]
    start = time.perf_counter()
    ours = [o.outputs.embedding for b in batches for o in llm.embed(b, use_tqdm=False)]
    octavo_s = time.perf_counter() - start
    start = time.perf_counter()
    theirs = [reference.encode(b, batch_size=batch_size, show_progress_bar=False) for b in batches]
    st_s = time.perf_counter() - start
    return octavo_s, st_s, np.asarray(ours), np.concatenate(theirs)


def sentence_transformers_folder(model: str | None, scratch: Path) -> Path:
    """``model`` if it is a sentence-transformers folder, else links to its files plus
    last-token pooling and normalisation."""
    from octavo.model_executor.embedded import embedded_model_folder

    source = Path(model) if model else embedded_model_folder()
    if (source / "modules.json").is_file():
        return source
    folder = scratch / "st-model"
    folder.mkdir()
    for item in source.iterdir():
        (folder / item.name).symlink_to(item.resolve())
    write_pooling_modules(folder)
    return folder


def write_pooling_modules(folder: Path) -> None:
    import json

    kind = "sentence_transformers.models."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": kind + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": kind + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": kind + "Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "2_Normalize").mkdir()
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    pooling = {
        "word_embedding_dimension": hidden,
        "pooling_mode_lasttoken": True,
        "include_prompt": True,
    }
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
