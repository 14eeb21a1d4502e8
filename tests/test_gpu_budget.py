"""The GPU KV budget as plain numbers (no GPU needed): ``--kv-cache-memory`` is honoured
on a GPU or refused with a line; the activations are the profiled step's peak plus the
sampler's copies (the peak faked here: ``test_memory_profile`` runs the real dummy step),
and the estimate pipeline stages use covers every logits row a step can have
(speculative k + 1 rows, prompt-logprob rows), not just one per sequence."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from octavo.config import DEFAULT_CPU_KV_CACHE_MEMORY, EngineArgs
from octavo.distributed import parallel_state
from octavo.distributed.parallel_state import PipelineStage
from octavo.engine.kv_setup import kv_budget
from octavo.kv_cache import gpu_budget
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.kv_cache.gpu_budget import (
    GpuMemory,
    StepRows,
    activation_bytes,
    requested_budget,
    step_rows,
    unprofiled_bytes,
    utilization_budget,
)
from octavo.scheduler.scheduler import PROMPT_SCORING_ROWS_PER_STEP
from octavo.worker import worker as worker_module
from octavo.worker.worker import CacheShape, KVBudget, Worker, WorkerConfig

GiB = 2**30
PROFILED_PEAK = 3 * GiB // 2  # what the dummy step "measured"


@dataclass
class Shape:  # SmolLM2-135M's numbers
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    hidden_size: int = 576
    intermediate_size: int = 1536
    vocab_size: int = 49152


def test_the_row_bound_counts_speculating_and_prompt_scoring_rows():
    assert step_rows(2048, 256) == StepRows(tokens=2048, logits=2048, sampled=256)
    assert step_rows(2048, 256, num_speculative_tokens=4).sampled == 256 * 5
    assert step_rows(512, 256, num_speculative_tokens=4).sampled == 256 + 512  # tokens cap k+1
    # the scheduler scores at most PROMPT_SCORING_ROWS_PER_STEP prompt tokens a step
    assert step_rows(8192, 8, 0, PROMPT_SCORING_ROWS_PER_STEP).logits == 8 + 256
    assert step_rows(8192, 8, 3, PROMPT_SCORING_ROWS_PER_STEP).logits == 8 * 4 + 256
    assert step_rows(2048, 256, 0, PROMPT_SCORING_ROWS_PER_STEP).logits == 256 + 256
    assert step_rows(300, 256, 0, PROMPT_SCORING_ROWS_PER_STEP).logits == 300  # the budget


def test_the_estimate_holds_a_step_of_prompt_logprob_rows():
    """8 sequences, a 2048-token step: the old estimate counted 8 logits rows (8 x 49152 x
    8 bytes = 3 MiB); a step that scores a prompt has 8 + 256 of them, in bf16 and fp32."""
    shape, rows = Shape(), step_rows(2048, 8, 0, PROMPT_SCORING_ROWS_PER_STEP)
    estimate = activation_bytes(shape, rows, torch.bfloat16)
    logits_of_the_step = (8 + 256) * shape.vocab_size * (2 + 4)
    assert estimate > logits_of_the_step + 8 * shape.vocab_size * 8
    per_token = (6 * 576 + 3 * 1536 + 15 * 64) * 2
    assert estimate == 2048 * per_token + 264 * 49152 * 10 + 8 * 49152 * 16


def test_speculating_rows_are_counted():
    shape = Shape()
    plain = activation_bytes(shape, step_rows(2048, 64), torch.bfloat16)
    speculating = activation_bytes(shape, step_rows(2048, 64, 4), torch.bfloat16)
    assert speculating - plain == 64 * 4 * shape.vocab_size * gpu_budget.SAMPLER_BYTES_PER_LOGIT


MEMORY = GpuMemory(total=80 * GiB, free=60 * GiB, reserved=12 * GiB, allocated=10 * GiB)


def test_utilization_leaves_the_kv_cache_the_rest_of_this_instances_share():
    # 72 GiB allowed; weights 10; activations 2. Another process's 8 GiB (80 - 60 - 12) is
    # not this instance's: not subtracted (it was, and 8 GiB of the share went unused).
    assert utilization_budget(MEMORY, 0.9, 2 * GiB) == int(80 * GiB * 0.9) - 12 * GiB


def after_loading(total: int, others: int, weights: int) -> GpuMemory:
    """A GPU once this process's weights are loaded (torch caching them exactly)."""
    return GpuMemory(total, total - others - weights, reserved=weights, allocated=weights)


def test_two_instances_at_045_share_one_gpu():
    """vLLM's rule: the first takes 45 % of 80 GiB; the second, started next to it, gets
    the same KV cache (its share is its own, whatever the first holds)."""
    first = utilization_budget(after_loading(80 * GiB, 0, 10 * GiB), 0.45, 2 * GiB)
    assert first == int(80 * GiB * 0.45) - 12 * GiB
    held_by_first = 10 * GiB + first + 2 * GiB
    second = after_loading(80 * GiB, held_by_first, 10 * GiB)
    assert utilization_budget(second, 0.45, 2 * GiB) == first


def test_a_share_with_nothing_left_or_not_free_is_refused():
    with pytest.raises(ValueError, match=r"nothing is left for the KV cache; raise --gpu-memory"):
        utilization_budget(after_loading(80 * GiB, 0, 10 * GiB), 0.15, 2 * GiB, "cuda:0")
    crowded = after_loading(80 * GiB, 60 * GiB, 10 * GiB)  # 10 GiB free, a 24 GiB cache
    with pytest.raises(ValueError, match=r"only 8\.00 GiB is free .* \(60\.00 GiB is held by"):
        utilization_budget(crowded, 0.45, 2 * GiB, "cuda:0")


def test_kv_cache_memory_is_given_when_it_fits_and_refused_when_not():
    # available: 60 free + 2 cached-but-unused = 62 GiB; activations 2 GiB
    assert requested_budget(MEMORY, 60 * GiB, 2 * GiB, "cuda:0") == 60 * GiB
    with pytest.raises(ValueError, match=r"--kv-cache-memory 61\.00 GiB does not fit on cuda:0"):
        requested_budget(MEMORY, 61 * GiB, 2 * GiB, "cuda:0")


def a_smaller_gpu(monkeypatch) -> None:
    """Device properties of a 24 GiB GPU (step budget 2048 served, as vLLM's defaults)."""
    gpu = SimpleNamespace(name="NVIDIA L4", total_memory=24 * GiB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)


def test_the_builder_passes_kv_cache_memory_to_gpu_workers(monkeypatch):
    monkeypatch.delenv("OCTAVO_KV_CACHE_MEMORY", raising=False)
    a_smaller_gpu(monkeypatch)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    args = EngineArgs(kv_cache_memory=3 * GiB, max_num_seqs=32)
    assert kv_budget(args, cuda, 2, 1024) == KVBudget(3 * GiB, 0.9, 2048, 32, 2)
    assert kv_budget(EngineArgs(), cuda, 0, 1024).kv_cache_bytes is None  # the utilization sizes it
    assert kv_budget(EngineArgs(), cpu, 0, 1024).kv_cache_bytes == DEFAULT_CPU_KV_CACHE_MEMORY


def test_the_offline_engine_reads_the_servers_kv_cache_variable_on_cpu(monkeypatch):
    a_smaller_gpu(monkeypatch)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.setenv("OCTAVO_KV_CACHE_MEMORY", "96MiB")
    assert kv_budget(EngineArgs(), cpu, 0, 1024).kv_cache_bytes == 96 * 2**20
    assert kv_budget(EngineArgs(kv_cache_memory=GiB), cpu, 0, 1024).kv_cache_bytes == GiB
    assert kv_budget(EngineArgs(), cuda, 0, 1024).kv_cache_bytes is None
    monkeypatch.setenv("OCTAVO_KV_CACHE_MEMORY", "lots")
    with pytest.raises(ValueError, match="OCTAVO_KV_CACHE_MEMORY: not a size in bytes: 'lots'"):
        kv_budget(EngineArgs(), cpu, 0, 1024)


def gpu_worker(monkeypatch, kv_cache_dtype: str = "auto") -> Worker:
    """A Worker as on a GPU after loading (its memory faked: ``MEMORY``), no model."""
    worker = object.__new__(Worker)
    config = Shape()
    cuda = torch.device("cuda", 0)
    spec = WorkerConfig(None, config, torch.bfloat16, cuda, 2048, 16, frozenset())
    worker.spec = dataclasses.replace(spec, kv_cache_dtype=kv_cache_dtype)
    worker.device, worker.draft = worker.spec.device, None
    worker.cache_shape = CacheShape(config.num_layers, config.num_kv_heads, config.head_dim)
    monkeypatch.setattr(GpuMemory, "of", classmethod(lambda cls, device: MEMORY))
    steps = []

    def measured(build, shape, step, cache):
        steps.append(step)
        return PROFILED_PEAK

    monkeypatch.setattr(worker_module, "measure_step_peak", measured)
    worker.profiled_steps = steps
    return worker


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_a_gpu_worker_gives_its_cache_exactly_kv_cache_memory(monkeypatch, kv_cache_dtype):
    worker = gpu_worker(monkeypatch, kv_cache_dtype)
    dtype = worker.spec.cache_dtype
    blocks = worker.num_available_blocks(KVBudget(4 * GiB, 0.9, 2048, 256))
    assert blocks == 4 * GiB // bytes_per_block(worker.cache_shape, 16, dtype)
    with pytest.raises(ValueError, match="does not fit"):
        worker.num_available_blocks(KVBudget(70 * GiB, 0.9, 2048, 256))


def test_a_gpu_worker_without_kv_cache_memory_uses_the_utilization(monkeypatch):
    worker = gpu_worker(monkeypatch)
    rows = step_rows(2048, 256, 0, PROMPT_SCORING_ROWS_PER_STEP)
    activations = PROFILED_PEAK + unprofiled_bytes(rows, Shape().vocab_size)
    left = utilization_budget(MEMORY, 0.9, activations)
    blocks = worker.num_available_blocks(KVBudget(None, 0.9, 2048, 256))
    assert blocks == left // bytes_per_block(worker.cache_shape, 16, torch.bfloat16)
    (step,) = worker.profiled_steps  # the largest step: 2048 tokens over 256 sequences
    assert step.lengths == [8] * 256 and step.logits_rows == rows.logits


def test_a_pipeline_stage_estimates_its_activations(monkeypatch):
    """A stage cannot run a step alone: the estimate replaces the measurement there."""
    worker = gpu_worker(monkeypatch)
    monkeypatch.setattr(parallel_state, "_STAGE", PipelineStage(stage=0, size=2))
    rows = step_rows(2048, 256, 0, PROMPT_SCORING_ROWS_PER_STEP)
    estimate = activation_bytes(Shape(), rows, torch.bfloat16)
    assert worker.step_activation_bytes(rows, 256) == estimate
    assert worker.profiled_steps == []
