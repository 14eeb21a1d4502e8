"""The CPU attention benchmark's vLLM side, run by path with the vLLM venv's python.

    <vllm venv>/bin/python cpu_attention_vllm_runner.py REQUEST.json RESULT.json

Standalone on purpose, as vllm_runner.py: it imports only vLLM, torch and the standard
library. It times vLLM's own CPU attention op (``cpu_attention_with_kv_cache``, the one its
CPU backend calls for prefill and decode alike) on random inputs of the same shapes, with
the instruction-set variant vLLM's backend would pick on this CPU.

REQUEST.json::

    {"dtype": "bfloat16", "heads": 9, "kv_heads": 3, "head_dim": 64, "block_size": 128,
     "threads": 2, "repeats": 20,
     "cases": [{"name": "prefill 512", "query_lens": [512], "seq_lens": [512]}, ...]}

RESULT.json::

    {"vllm_version": "0.32.0", "isa": "vec", "results": [{"name": ..., "ms": 0.9}, ...]}

When vLLM cannot be imported: ``{"error": "..."}`` and exit status 3.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

IMPORT_FAILED = 3

_HERE = str(Path(__file__).resolve().parent)  # never shadow vLLM's imports (cli, report)
sys.path[:] = [entry for entry in sys.path if str(Path(entry or ".").resolve()) != _HERE]


def case_inputs(torch, request: dict, case: dict) -> dict:
    """A paged cache holding every sequence's context, and the step's queries."""
    dtype = getattr(torch, request["dtype"])
    heads, kv_heads, dim = request["heads"], request["kv_heads"], request["head_dim"]
    block = request["block_size"]
    blocks = [-(-length // block) for length in case["seq_lens"]]
    cache = torch.randn(sum(blocks) + 1, kv_heads, 2 * block, dim).to(dtype)
    table = torch.zeros(len(blocks), max(blocks), dtype=torch.int32)
    first = 1
    for row, count in enumerate(blocks):
        table[row, :count] = torch.arange(first, first + count)
        first += count
    starts = [0]
    for length in case["query_lens"]:
        starts.append(starts[-1] + length)
    query = torch.randn(starts[-1], heads, dim).to(dtype)
    return {
        "cache": cache,
        "table": table,
        "query": query,
        "starts": torch.tensor(starts, dtype=torch.int32),
        "lens": torch.tensor(case["seq_lens"], dtype=torch.int32),
    }


def timed_ms(call, repeats: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_case(torch, ops, isa: str, request: dict, case: dict) -> float:
    x = case_inputs(torch, request, case)
    key_cache, value_cache = x["cache"].chunk(2, dim=2)
    out = torch.empty_like(x["query"])
    dim = request["head_dim"]
    metadata = ops.cpu_attn_get_scheduler_metadata(
        len(case["seq_lens"]),
        request["heads"],
        request["kv_heads"],
        dim,
        x["lens"],
        x["query"].dtype,
        x["starts"],
        True,
        -1,
        isa,
        False,
    )

    def call() -> None:
        ops.cpu_attention_with_kv_cache(
            x["query"],
            key_cache,
            value_cache,
            out,
            x["starts"],
            x["lens"],
            dim**-0.5,
            True,
            None,
            -1,
            x["table"],
            0.0,
            metadata,
            None,
        )

    return timed_ms(call, request["repeats"])


def main() -> int:
    request = json.loads(Path(sys.argv[1]).read_text())
    try:
        import torch
        import vllm
        import vllm._custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except Exception as error:  # not installed, or a build that cannot load here
        Path(sys.argv[2]).write_text(json.dumps({"error": f"import vllm failed: {error}"}))
        return IMPORT_FAILED
    torch.set_num_threads(request["threads"])
    # In vLLM's engine the linears' oneDNN AMX GEMMs have asked Linux for the tile state
    # before attention runs; alone, its AMX attention would die of SIGILL without this.
    if hasattr(torch.cpu, "_init_amx"):
        torch.cpu._init_amx()
    dtype = getattr(torch, request["dtype"])
    isa = _get_attn_isa(dtype, request["block_size"], request["head_dim"])
    results = [
        {"name": case["name"], "ms": run_case(torch, ops, isa, request, case)}
        for case in request["cases"]
    ]
    result = {"vllm_version": vllm.__version__, "isa": isa, "results": results}
    Path(sys.argv[2]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
