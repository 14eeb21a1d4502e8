"""The offline benchmark's llama.cpp baseline, run by path with the llama.cpp venv's python.

    <llama.cpp venv>/bin/python llama_cpp_runner.py [REQUEST.json]   # else the request on stdin

Standalone on purpose: it imports only ``llama_cpp`` (llama-cpp-python) and the standard
library (never ``octavo``, ``octavo_bench`` or torch), so it runs in a venv that has
llama.cpp and nothing of Octavo (``make llama-cpp-venv``).

REQUEST.json::

    {"model_path": "/path/to/model.gguf", "n_threads": 2, "n_ctx": 1024, "n_batch": 512,
     "seed": 0,
     "warmup": {"prompts": [[1, 2, 3], ...], "max_tokens": [8, ...]},
     "workloads": [{"name": "a", "prompts": [[...], ...], "max_tokens": [128, ...]}, ...]}

Prompts are token ids (the GGUF's vocabulary). Each prompt is decoded greedily (temperature
0, no repetition penalty) for exactly ``max_tokens`` new tokens: the runner stops at the
count only, so an end-of-sequence token does not end a request early. llama-cpp-python's
``Llama`` holds one sequence, so a workload's prompts run one after another (one stream at
a time, ``"sequential": true``), each from an empty KV cache (no prefix reuse between
requests). After an untimed warm-up, each workload is timed whole.

Prints one JSON line on stdout (progress goes to stderr)::

    {"llama_cpp_version": "0.3.36", "n_threads": 2, "model_bytes": 95000000,
     "load_s": 0.2, "sequential": true, "system_info": "CPU : AVX2 = 1 | ...",
     "results": [{"name": "a", "num_requests": 32, "requested_tokens": 4096,
                  "output_tokens": 4096, "seconds": 30.1, "tok_s": 136.1,
                  "sequential": true}, ...]}

or, when llama_cpp cannot be imported, ``{"error": "..."}`` and exit status 3.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

IMPORT_FAILED = 3  # exit status when llama_cpp cannot be imported
DEFAULT_N_BATCH = 512

# Run by path, this folder comes first on sys.path; its modules (cli, report, ...) must not
# shadow top-level modules llama_cpp imports.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [entry for entry in sys.path if str(Path(entry or ".").resolve()) != _HERE]


def log(message: str) -> None:
    print(f"llama_cpp_runner: {message}", file=sys.stderr, flush=True)


def generate_one(llm, prompt: list[int], max_tokens: int) -> int:
    """Exactly ``max_tokens`` greedy tokens after ``prompt``, from an empty KV cache.

    ``Llama.generate`` never stops by itself (EOS handling lives in its completion API):
    the loop ends at the count alone.
    """
    llm.reset()  # no prefix reuse from the previous request
    made = 0
    if max_tokens <= 0:
        return made
    for _token in llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True):
        made += 1
        if made >= max_tokens:
            break
    return made


def generate(llm, prompts: list[list[int]], max_tokens: list[int]) -> int:
    """Every prompt in turn (one sequence at a time); returns the tokens made."""
    return sum(generate_one(llm, prompt, n) for prompt, n in zip(prompts, max_tokens, strict=True))


def time_workload(llm, workload: dict) -> dict:
    prompts, max_tokens = workload["prompts"], workload["max_tokens"]
    start = time.perf_counter()
    made = generate(llm, prompts, max_tokens)
    seconds = time.perf_counter() - start
    return {
        "name": workload["name"],
        "num_requests": len(prompts),
        "requested_tokens": sum(max_tokens),
        "output_tokens": made,
        "seconds": seconds,
        "tok_s": made / seconds if seconds > 0 else 0.0,
        "sequential": True,
    }


def required_context(request: dict) -> int:
    """The longest prompt + new tokens of the request (warm-up included)."""
    groups = [request.get("warmup", {}), *request["workloads"]]
    return max(
        (
            len(prompt) + n
            for g in groups
            for prompt, n in zip(g.get("prompts", []), g.get("max_tokens", []), strict=True)
        ),
        default=1,
    )


def load(llama_cpp, request: dict):
    n_threads = int(request["n_threads"])
    n_ctx = int(request.get("n_ctx") or required_context(request))
    n_batch = int(request.get("n_batch") or min(n_ctx, DEFAULT_N_BATCH))
    return llama_cpp.Llama(
        model_path=request["model_path"],
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        seed=int(request.get("seed", 0)),
        logits_all=False,
        verbose=False,
    )


def system_info(llama_cpp) -> str:
    try:
        return llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    except Exception:  # an old or stand-in build without it
        return ""


def run(request: dict) -> dict:
    try:
        import llama_cpp
    except Exception as error:  # not installed, or a build that cannot load here
        return {"error": f"import llama_cpp failed: {type(error).__name__}: {error}"}
    start = time.perf_counter()
    llm = load(llama_cpp, request)
    load_s = time.perf_counter() - start
    warmup = request.get("warmup", {})
    generate(llm, warmup.get("prompts", []), warmup.get("max_tokens", []))
    results = []
    for workload in request["workloads"]:
        log(f"workload {workload['name']} ({len(workload['prompts'])} requests, sequential)")
        result = time_workload(llm, workload)
        results.append(result)
        log(f"{result['name']}: {result['output_tokens']} tokens in {result['seconds']:.2f} s")
    return {
        "llama_cpp_version": getattr(llama_cpp, "__version__", "unknown"),
        "n_threads": int(request["n_threads"]),
        "model_path": request["model_path"],
        "model_bytes": os.path.getsize(request["model_path"]),
        "load_s": load_s,
        "sequential": True,
        "system_info": system_info(llama_cpp),
        "results": results,
    }


def read_request(argv: list[str]) -> dict:
    text = Path(argv[0]).read_text() if argv else sys.stdin.read()
    return json.loads(text)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(f"usage: {Path(__file__).name} [REQUEST.json]", file=sys.stderr)
        return 2
    result = run(read_request(argv))
    print(json.dumps(result), flush=True)
    if "error" in result:
        log(result["error"])
        return IMPORT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
