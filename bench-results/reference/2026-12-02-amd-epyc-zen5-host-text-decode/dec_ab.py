"""fp32 paged decode attention on one thread: the 10th percentile of thread CPU ms a call.

    PYTHONPATH=<checkout>/server python dec_ab.py 8x400,16x400 200

One process per build (the kernels load under one op namespace); alternate checkouts.
"""

import sys
import time

import torch

from octavo.kernels.cpu_build import cpu_ops

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16  # SmolLM2-135M's attention


def case_inputs(seqs: int, context: int) -> tuple:
    blocks = (context + BLOCK - 1) // BLOCK
    cache = torch.randn(2, seqs * blocks + 1, BLOCK, KV_HEADS, HEAD_DIM)
    order = torch.randperm(seqs * blocks) + 1  # shuffled blocks, block 0 left out
    tables = order.view(seqs, blocks).int().contiguous()
    lens = torch.full((seqs,), context, dtype=torch.int32)
    query = torch.randn(seqs, HEADS, HEAD_DIM)
    return torch.empty_like(query), query, cache, tables, lens


def time_case(seqs: int, context: int, calls: int) -> float:
    out, query, cache, tables, lens = case_inputs(seqs, context)
    decode = torch.ops.octavo_cpu.paged_decode_attention
    args = (out, query, cache, tables, lens, HEAD_DIM**-0.5, 1.0, 1.0, 0, 0.0, None)
    for _ in range(20):
        decode(*args)
    spent = []
    for _ in range(calls):
        start = time.thread_time()
        decode(*args)
        spent.append(time.thread_time() - start)
    return sorted(spent)[calls // 10] * 1e3


def main() -> None:
    cpu_ops()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cases = [tuple(map(int, case.split("x"))) for case in sys.argv[1].split(",")]
    print(" ".join(f"{s}x{c}={time_case(s, c, int(sys.argv[2])):.3f}" for s, c in cases))


main()
