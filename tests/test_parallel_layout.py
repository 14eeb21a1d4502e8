"""The parallel layout's pieces on their own: checks made before workers start, the split of
layers over stages and of a step into micro-batches, shard-only checkpoint reads, and the
executor's handling of worker errors and deaths."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from octavo import LLM
from octavo.distributed.parallel_config import ParallelConfig
from octavo.distributed.parallel_state import PipelineStage
from octavo.executor.multiproc_executor import WorkerCallFailed, WorkerDied
from octavo.model_executor.checkpoint_slice import CheckpointSlice, materialize
from octavo.model_executor.micro_batches import split_micro_batches
from octavo.scheduler.output import ScheduledSequence, SchedulerOutput

CPU = torch.device("cpu")


@dataclass
class Shape:
    num_heads: int = 8
    num_kv_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = 256
    num_layers: int = 4


def test_a_layout_that_fits_has_no_problems():
    assert ParallelConfig(2, 2).problems(Shape(), CPU) == []
    assert ParallelConfig(4, 1).problems(Shape(), CPU) == []  # 2 KV heads, each on 2 ranks


@pytest.mark.parametrize(
    ("shape", "layout", "message"),
    [
        (Shape(num_heads=9), (2, 1), "attention heads (9) cannot be split evenly"),
        (Shape(num_heads=12, num_kv_heads=3), (2, 1), "3 KV heads can be neither split"),
        (Shape(intermediate_size=130, num_heads=4), (4, 1), "intermediate size (130)"),
        (Shape(vocab_size=255), (2, 1), "vocabulary size (255)"),
        (Shape(num_layers=2), (1, 3), "2 layers cannot be split over pipeline_parallel_size 3"),
    ],
)
def test_a_layout_the_model_cannot_take_is_named(shape, layout, message):
    problems = ParallelConfig(*layout).problems(shape, CPU)
    assert any(message in problem for problem in problems), problems


def test_more_ranks_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    problems = ParallelConfig(2, 2).problems(Shape(), torch.device("cuda"))
    assert problems == [
        "tensor_parallel_size × pipeline_parallel_size = 4 needs 4 GPUs, but 2 are visible"
    ]
    assert (
        "CUDA_VISIBLE_DEVICES" in ParallelConfig(2, 1).problems(Shape(), torch.device("cuda:1"))[0]
    )


def test_engine_refuses_a_bad_layout_before_any_worker_starts(smol_folder):
    with pytest.raises(ValueError, match=r"attention heads \(9\) cannot be split evenly over"):
        LLM(str(smol_folder), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="pipeline_parallel_size must be >= 1"):
        LLM(str(smol_folder), pipeline_parallel_size=0)


@pytest.mark.parametrize(("layers", "stages"), [(30, 2), (30, 4), (7, 3), (4, 4)])
def test_stages_split_the_layers_evenly_and_completely(layers, stages):
    ranges = [PipelineStage(s, stages).layer_range(layers) for s in range(stages)]
    assert ranges[0][0] == 0 and ranges[-1][1] == layers
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def scheduled(tokens: int, seq_id: int) -> ScheduledSequence:
    return ScheduledSequence(seq_id, [1] * tokens, 0, [1], sample=True)


def test_micro_batches_are_contiguous_balanced_and_keep_prefills_first():
    step = SchedulerOutput(
        prefills=[scheduled(40, 0), scheduled(30, 1)],
        decodes=[scheduled(1, i) for i in range(2, 12)],
    )
    batches = split_micro_batches(step.scheduled, len(step.prefills), 2)
    assert [s for b in batches for s in b.scheduled] == step.scheduled
    assert [b.num_prefills for b in batches] == [1, 1]
    assert [sum(s.num_new_tokens for s in b.scheduled) for b in batches] == [40, 40]


def test_fewer_sequences_than_micro_batches():
    batches = split_micro_batches([scheduled(1, 0)], 0, 4)
    assert len(batches) == 1 and batches[0].num_prefills == 0


def test_a_checkpoint_slice_reads_only_the_part_asked_for(tmp_path):
    weight = torch.arange(24.0).reshape(4, 6)
    save_file({"w": weight}, tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as reader:
        lazy = CheckpointSlice(reader.get_slice("w"))
        assert lazy.shape == weight.shape
        assert torch.equal(lazy.narrow(0, 1, 2), weight[1:3])
        assert torch.equal(lazy.narrow(1, 3, 3), weight[:, 3:])
        assert torch.equal(materialize(lazy), weight)


@pytest.fixture(scope="module")
def two_ranks(tiny_folder) -> Iterator[LLM]:
    """The tiny Llama-3 on two tensor-parallel ranks, shared by the module's last two tests:
    the error test leaves it serving, the dead-worker test (last) kills one of its workers."""
    llm = LLM(
        str(tiny_folder("llama3")),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory=2**20,
        tensor_parallel_size=2,
    )
    yield llm
    llm.shutdown()


def test_an_error_on_every_rank_fails_the_call_and_the_workers_go_on(two_ranks):
    executor = two_ranks.engine.executor
    with pytest.raises(WorkerCallFailed, match="TypeError"):
        executor.call("initialize_cache", "not a number")
    assert executor.call("parameter_bytes")[0] > 0  # still serving calls


def test_a_dead_worker_is_noticed_and_the_rest_are_stopped(two_ranks):
    executor = two_ranks.engine.executor
    assert all(worker.process.poll() is None for worker in executor.workers)
    os.kill(executor.workers[1].process.pid, signal.SIGKILL)
    executor.workers[1].process.wait()
    with pytest.raises(WorkerDied, match=r"worker 1 \(pid \d+\) exited with code -9"):
        executor.check_health()
    assert all(worker.process.poll() is not None for worker in executor.workers)
    with pytest.raises(WorkerDied):
        two_ranks.generate("Hello", use_tqdm=False)
