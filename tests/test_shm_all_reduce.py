"""The shared-memory all-reduce between CPU tensor-parallel workers: two real processes
joined by gloo exchange many tensors (so both buffers are reused) and every result equals
the sum taken in rank order, bit for bit; gathers interleaved with them hand rank 0 every
rank's tensor; a tensor larger than a slot goes through gloo; the segment is gone from
/dev/shm once both ranks have mapped it."""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.distributed.shm_all_reduce import SHM_DIR, SLOT_BYTES, create_shared_all_reduce
from octavo.kernels.cpu_build import cpu_ops

WORLD = 2
CALLS = 40


def rank_tensor(rank: int, call: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * call + rank)
    size = 1 + (call * 37) % 3000
    return torch.randn(size, generator=generator).to(dtype)


def expected_sum(call: int, dtype: torch.dtype) -> torch.Tensor:
    total = torch.zeros_like(rank_tensor(0, call, torch.float32))
    for rank in range(WORLD):
        total += rank_tensor(rank, call, dtype).float()
    return total.to(dtype)


def rank_main(rank: int, port: int, name: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    shared = create_shared_all_reduce(name, rank, WORLD, None, 0)
    group = TensorParallelGroup(rank, WORLD, None, 0, shared)
    mismatches = []
    for call in range(CALLS):
        dtype = torch.bfloat16 if call % 2 else torch.float32
        tensor = rank_tensor(rank, call, dtype)
        if call % 3 == 0:  # a gather: rank 0 gets both pieces side by side
            gathered = group.gather_last_dim(tensor)
            expected = torch.cat([rank_tensor(r, call, dtype) for r in range(WORLD)])
            if (gathered is None) != (rank != 0) or (
                rank == 0 and not torch.equal(gathered, expected)
            ):
                mismatches.append(call)
            continue
        group.all_reduce(tensor)
        if not torch.equal(tensor, expected_sum(call, dtype)):
            mismatches.append(call)
    big = torch.full((SLOT_BYTES // 4 + 1,), float(rank + 1))  # one element over a slot
    group.all_reduce(big)
    results.put((rank, shared is not None, mismatches, bool((big == 3.0).all()), shared.calls))
    dist.destroy_process_group()


@pytest.mark.skipif(cpu_ops() is None, reason="the native CPU kernels did not build here")
def test_two_processes_sum_exactly_through_shared_memory():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    name = f"test-{port}"
    procs = [context.Process(target=rank_main, args=(r, port, name, results)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    reports = sorted(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    for rank, used_shared_memory, mismatches, big_ok, calls in reports:
        assert used_shared_memory, rank
        assert mismatches == [], (rank, mismatches)
        assert big_ok and calls == CALLS  # the big tensor went through gloo
    assert not Path(SHM_DIR / f"octavo-{name}").exists()
