"""The rerank and embedding benchmarks' vLLM side, run by path with the vLLM venv's python.

    <vllm venv>/bin/python rerank_vllm_runner.py REQUEST.json RESULT.json

Standalone on purpose, as vllm_runner.py: it imports only vLLM and the standard library.

REQUEST.json::

    {"model": "/path/to/folder", "dtype": "float32", "max_model_len": 512,
     "task": "score",                       # or "embed"
     "warmup": {"query": "...", "documents": ["...", ...]},
     "repeats": [{"queries": ["...", ...], "documents": [["...", ...], ...]}, ...]}

``score``: one ``LLM.score(query, documents)`` per query, in order; ``embed`` (no queries):
one ``LLM.embed(batch)`` per batch of ``documents``. Each repeat is timed whole.

RESULT.json::

    {"vllm_version": "0.32.0", "load_s": 3.2,
     "results": [{"wall_s": 1.5, "scores": [[0.5, ...], ...]}, ...]}

``scores``: per query its documents' scores (``score``), or per batch its vectors
(``embed``). When vLLM cannot be imported: ``{"error": "..."}`` and exit status 3.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

IMPORT_FAILED = 3

_HERE = str(Path(__file__).resolve().parent)  # never shadow vLLM's imports (cli, report)
sys.path[:] = [entry for entry in sys.path if str(Path(entry or ".").resolve()) != _HERE]


def load(request: dict):
    from vllm import LLM

    settings = {
        "model": request["model"],
        "dtype": request["dtype"],
        "max_model_len": request["max_model_len"],
        "seed": 0,
    }
    try:
        return LLM(runner="pooling", **settings)
    except TypeError:  # vLLM before runner=: the task names the pooling kind
        return LLM(task=request["task"], **settings)


def run_repeat(llm, task: str, repeat: dict) -> list:
    if task == "score":
        return [
            [output.outputs.score for output in llm.score(query, documents, use_tqdm=False)]
            for query, documents in zip(repeat["queries"], repeat["documents"], strict=True)
        ]
    return [
        [output.outputs.embedding for output in llm.embed(batch, use_tqdm=False)]
        for batch in repeat["documents"]
    ]


def run(request: dict) -> dict:
    try:
        import vllm
    except Exception as error:  # not installed, or a build that cannot load here
        return {"error": f"import vllm failed: {type(error).__name__}: {error}"}
    start = time.perf_counter()
    llm = load(request)
    load_s = time.perf_counter() - start
    task = request["task"]
    warmup = request["warmup"]
    run_repeat(llm, task, {"queries": [warmup["query"]], "documents": [warmup["documents"]]})
    results = []
    for index, repeat in enumerate(request["repeats"]):
        start = time.perf_counter()
        scores = run_repeat(llm, task, repeat)
        wall = time.perf_counter() - start
        results.append({"wall_s": wall, "scores": scores})
        print(f"rerank_vllm_runner: repeat {index}: {wall:.2f} s", flush=True)
    return {
        "vllm_version": getattr(vllm, "__version__", "unknown"),
        "load_s": load_s,
        "results": results,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {Path(__file__).name} REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    result = run(json.loads(Path(argv[0]).read_text()))
    Path(argv[1]).write_text(json.dumps(result))
    if "error" in result:
        print(f"rerank_vllm_runner: {result['error']}", file=sys.stderr)
        return IMPORT_FAILED
    return 0


if __name__ == "__main__":  # guarded: vLLM's spawned workers re-import this file
    sys.exit(main(sys.argv[1:]))
