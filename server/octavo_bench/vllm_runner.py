"""The offline benchmark's vLLM baseline, run by path with the vLLM venv's python.

    <vllm venv>/bin/python vllm_runner.py REQUEST.json RESULT.json

Standalone on purpose: it imports only vLLM and the standard library (never ``octavo``
or ``octavo_bench``), so it runs in a venv that has vLLM and nothing of Octavo.

REQUEST.json::

    {"model": "/path/to/hf/folder", "dtype": "bfloat16", "max_model_len": 2048, "seed": 0,
     "warmup": {"prompts": [[1, 2, 3], ...], "max_tokens": [8, ...]},
     "workloads": [{"name": "a", "prompts": [[...], ...], "max_tokens": [128, ...]}, ...]}

Prompts are token ids; or (the vision benchmark) texts, when the warm-up and each
workload also carry ``"images": [["/path/a.png", ...], ...]`` (each prompt's images, sent
as PIL images in ``multi_modal_data``). ``"llm_kwargs"`` (optional) go to ``LLM(...)`` as
they are (e.g. ``limit_mm_per_prompt``). vLLM's offline ``LLM.generate`` runs greedy with
``ignore_eos`` and ``min_tokens = max_tokens``, so every request yields exactly its
tokens; after one untimed warm-up, each workload is submitted whole and timed.

RESULT.json::

    {"vllm_version": "0.32.0", "kernel_isa": "avx512_bf16", "load_s": 12.3,
     "results": [{"name": "a", "num_requests": 32, "requested_tokens": 4096,
                  "output_tokens": 4096, "wall_s": 5.1}, ...]}

or, when vLLM cannot be imported, ``{"error": "..."}`` and exit status 3.

With ``"turns": true`` and ``"reply_fd": N`` (``offline --rounds``), the runner takes
turns with its parent: after the warm-up it writes ``{"ready": true}`` as a line to file
descriptor N, then before each workload waits for a line on stdin (stopping at its end)
and after it writes the workload's result as a line to N. Meanwhile the parent's own
engine runs, never both at once. Each turn starts with an empty prefix cache.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

IMPORT_FAILED = 3  # exit status when vLLM cannot be imported

# Run by path, this folder comes first on sys.path; its modules (cli, report, ...) must not
# shadow top-level modules vLLM imports.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [entry for entry in sys.path if str(Path(entry or ".").resolve()) != _HERE]


def inputs_of(entry: dict) -> list[dict]:
    """vLLM's prompts for a workload (or the warm-up): token ids, or, with ``images`` (each
    prompt's PNG paths), texts with their PIL images, decoded here (before any timing)."""
    if "images" not in entry:
        return [{"prompt_token_ids": prompt} for prompt in entry["prompts"]]
    from PIL import Image

    return [
        {
            "prompt": text,
            "multi_modal_data": {"image": [Image.open(p).convert("RGB") for p in paths]},
        }
        for text, paths in zip(entry["prompts"], entry["images"], strict=True)
    ]


def generate(
    llm, sampling_params, inputs: list[dict], max_tokens: list[int], sampling: dict | None = None
) -> int:
    """Exactly ``max_tokens[i]`` tokens for each prompt, greedy unless ``sampling`` (the
    request's SamplingParams fields) says otherwise; returns the tokens made."""
    fields = {"temperature": 0.0, **(sampling or {})}
    params = [
        sampling_params(**fields, max_tokens=n, min_tokens=n, ignore_eos=True) for n in max_tokens
    ]
    outputs = llm.generate(inputs, params, use_tqdm=False)
    return sum(len(output.outputs[0].token_ids) for output in outputs)


def run(request: dict) -> dict:
    try:
        import vllm
        from vllm import LLM, SamplingParams
    except Exception as error:  # not installed, or a build that cannot load here
        return {"error": f"import vllm failed: {type(error).__name__}: {error}"}
    start = time.perf_counter()
    llm = LLM(
        model=request["model"],
        dtype=request["dtype"],
        max_model_len=request["max_model_len"],
        seed=request.get("seed", 0),
        **request.get("llm_kwargs", {}),
    )
    load_s = time.perf_counter() - start
    warmup = request["warmup"]
    sampling = request.get("sampling")
    generate(llm, SamplingParams, inputs_of(warmup), warmup["max_tokens"], sampling)
    reply(request, {"ready": True})
    results = []
    for workload in request["workloads"]:
        if not my_turn(request, llm):
            break
        print(f"vllm_runner: workload {workload['name']}", flush=True)
        inputs = inputs_of(workload)
        start = time.perf_counter()
        made = generate(llm, SamplingParams, inputs, workload["max_tokens"], sampling)
        wall = time.perf_counter() - start
        results.append(
            {
                "name": workload["name"],
                "num_requests": len(workload["prompts"]),
                "requested_tokens": sum(workload["max_tokens"]),
                "output_tokens": made,
                "wall_s": wall,
            }
        )
        print(f"vllm_runner: {workload['name']}: {made} tokens in {wall:.2f} s", flush=True)
        reply(request, results[-1])
    version = getattr(vllm, "__version__", "unknown")
    return {
        "vllm_version": version,
        "kernel_isa": kernel_isa(),
        "load_s": load_s,
        "results": results,
    }


def my_turn(request: dict, llm) -> bool:
    """In turns mode, wait for the parent's line on stdin (False at its end), and empty
    the prefix cache: the rounds repeat the workloads, whose prompts vLLM would otherwise
    find cached from the round before ((e) ran 89, 120, 171 tok/s in three rounds).
    Outside turns mode, go on."""
    if not request.get("turns"):
        return True
    if not sys.stdin.readline():
        return False
    llm.reset_prefix_cache()
    return True


def reply(request: dict, message: dict) -> None:
    """In turns mode, one JSON line to the parent's reply pipe."""
    if request.get("turns"):
        os.write(request["reply_fd"], (json.dumps(message) + "\n").encode())


def kernel_isa() -> str | None:
    """Which of vLLM's x86 kernel libraries its probes chose (None off x86): ``avx512_bf16``
    (``_C``), ``avx512`` (``_C_AVX512``) or ``avx2`` (``_C_AVX2``)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    import torch

    if not torch.cpu._is_avx512_supported():
        return "avx2"
    return "avx512_bf16" if torch.cpu._is_avx512_bf16_supported() else "avx512"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {Path(__file__).name} REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    result = run(request)
    Path(argv[1]).write_text(json.dumps(result))
    if "error" in result:
        print(f"vllm_runner: {result['error']}", file=sys.stderr)
        return IMPORT_FAILED
    return 0


if __name__ == "__main__":  # guarded: vLLM's spawned workers re-import this file
    sys.exit(main(sys.argv[1:]))
