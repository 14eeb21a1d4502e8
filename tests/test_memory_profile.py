"""GPU KV sizing by measurement: the dummy step of the largest batch (shape, blocks) runs
through the real model on CPU here; on a GPU its allocator peak sizes the KV cache. No GPU
on CI: the sizing is also run end to end on CPU with the allocator's statistics faked
(``fake_allocator.PeakMemory``), and the largest real step must fit what it set aside;
the CUDA test runs only where a GPU is."""

from __future__ import annotations

import math

import pytest
import torch

from fake_allocator import PeakMemory
from octavo import LLM, SamplingParams
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.kv_cache.gpu_budget import (
    GpuMemory,
    StepRows,
    step_rows,
    unprofiled_bytes,
    utilization_budget,
)
from octavo.model_executor.footprint import weight_bytes
from octavo.scheduler.scheduler import PROMPT_SCORING_ROWS_PER_STEP
from octavo.worker.memory_profile import (
    CacheSpec,
    DummyStep,
    dummy_logits,
    largest_step,
    measure_step_peak,
    scheduled,
    scratch_blocks,
)

CPU = torch.device("cpu")
MiB = 2**20


def test_the_largest_step_spends_the_token_budget_over_the_most_sequences():
    step = largest_step(step_rows(2048, 256), max_num_seqs=256, max_model_len=4096)
    assert step.lengths == [8] * 256 and step.tokens == 2048
    long = largest_step(StepRows(2048, 1, 4), max_num_seqs=4, max_model_len=256)
    assert long.lengths == [256] * 8  # no sequence beyond max_model_len
    uneven = largest_step(StepRows(10, 10, 3), max_num_seqs=3, max_model_len=64)
    assert uneven.lengths == [4, 3, 3] and uneven.logits_rows == 10
    assert largest_step(StepRows(5, 1, 1), 8, 64).logits_rows == 5  # one row per sequence


def test_dummy_sequences_get_blocks_of_their_own_after_the_null_block():
    step = DummyStep([20, 3, 16], logits_rows=3)
    sequences = scheduled(step, block_size=16)
    assert [s.block_ids for s in sequences] == [[1, 2], [3], [4]]
    assert [len(s.token_ids) for s in sequences] == [20, 3, 16]
    assert all(s.sample and s.num_computed_tokens == 0 for s in sequences)
    assert scratch_blocks(step, 16) == 5


@pytest.fixture(scope="module")
def worker(tiny_folder):
    folder = str(tiny_folder("llama3"))
    # device="cpu": on a GPU machine `auto` would put it on the GPU, and this test is the CPU's
    llm = LLM(folder, dtype="float32", max_model_len=128, kv_cache_memory=1 << 20, device="cpu")
    return llm.engine.executor.worker


def test_the_dummy_step_runs_through_the_real_model(worker):
    step = DummyStep([40, 17, 5], logits_rows=6)
    caches_made = []

    def build(caches):
        caches_made.append(caches)
        return worker.paged_model_on(caches)

    cache = CacheSpec(16, torch.float32, CPU)
    assert measure_step_peak(build, worker.cache_shape, step, cache) is None  # no CPU peak
    (caches,) = caches_made
    assert caches[0].shape[1] == scratch_blocks(step, 16) == 1 + 3 + 2 + 1
    logits = dummy_logits(worker.paged_model_on(caches), step, 16, CPU)
    assert logits.shape == (6, worker.spec.config.vocab_size)
    assert torch.isfinite(logits).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_peak_grows_with_the_step(tiny_folder):
    # The engine is shut down at the end: its KV cache takes most of the GPU's memory, which
    # the next test in this process would otherwise find gone.
    folder = str(tiny_folder("llama3"))
    with LLM(folder, dtype="bfloat16", max_model_len=512, device="cuda") as llm:
        worker = llm.engine.executor.worker
        cache = CacheSpec(16, torch.bfloat16, torch.device("cuda"))
        step = DummyStep([64], 1)
        small = measure_step_peak(worker.paged_model_on, worker.cache_shape, step, cache)
        large = DummyStep([512] * 8, 64)
        big = measure_step_peak(worker.paged_model_on, worker.cache_shape, large, cache)
        assert small is not None and big is not None and 0 < small < big
        rows = step_rows(4096, 8)
        assert worker.step_activation_bytes(rows, 8) > big
    torch.cuda.empty_cache()


TOKENS, SEQS, MAX_LEN = 256, 4, 128


def test_the_largest_step_runs_in_the_activations_the_profile_set_aside(tiny_folder):
    """The GPU sizing, end to end on CPU (no GPU here: CUDA's allocator statistics faked by
    ``fake_allocator.PeakMemory``): profile the dummy step, size the KV cache from a
    device share as ``utilization_budget`` does, then run the largest real step the
    scheduler makes (``max_num_batched_tokens`` over ``max_num_seqs`` prompts, sampled)
    and check it needs no more than the profile set aside, and its blocks fit the cache."""
    engine = {"max_num_batched_tokens": TOKENS, "max_num_seqs": SEQS, "max_model_len": MAX_LEN}
    with LLM(str(tiny_folder("llama3")), dtype="float32", device="cpu", **engine) as llm:
        worker = llm.engine.executor.worker
        rows = step_rows(TOKENS, SEQS, 0, PROMPT_SCORING_ROWS_PER_STEP)
        step = largest_step(rows, SEQS, MAX_LEN)
        with PeakMemory() as profiled:
            cache = CacheSpec(16, torch.float32, CPU)
            measure_step_peak(worker.paged_model_on, worker.cache_shape, step, cache)
        per_block = bytes_per_block(worker.cache_shape, 16, torch.float32)
        peak = profiled.peak - scratch_blocks(step, 16) * per_block  # as on a GPU: above
        set_aside = peak + unprofiled_bytes(rows, worker.spec.config.vocab_size)  # cache
        weights = weight_bytes(worker.model)
        share = weights + set_aside + 8 * MiB  # a device share with 8 MiB left for KV
        memory = GpuMemory(total=share, free=share, reserved=weights, allocated=weights)
        kv_bytes = utilization_budget(memory, 1.0, set_aside)
        blocks_needed = 1 + sum(math.ceil(length / 16) for length in step.lengths)
        assert kv_bytes // per_block >= blocks_needed

        prompts = torch.randint(10, 1000, (SEQS, TOKENS // SEQS)).tolist()
        # scored prompts: as many logits rows (and log-softmax copies) as a step can have
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
        with PeakMemory() as real:
            outputs = llm.generate(prompts, params, use_tqdm=False)
    print(
        "peaks (MiB): real step",
        real.peak / MiB,
        "profiled",
        profiled.peak / MiB,
        "set aside",
        set_aside / MiB,
    )  # pytest -s
    assert step.lengths == [TOKENS // SEQS] * SEQS  # the profile's shape is the real one
    assert all(len(output.outputs[0].token_ids) == 1 for output in outputs)
    assert 0 < real.peak <= set_aside, (real.peak, peak, set_aside)
    assert weights + kv_bytes + real.peak <= share
