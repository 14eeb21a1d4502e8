"""How much memory one step's activations take, measured: a dummy forward at the largest step.

As vLLM's ``profile_run``: before the KV cache exists, the worker runs one step of the
shape the scheduler can reach at most (the token budget as prefills spread over as many
sequences as it may run, logits for as many rows as a step can score) through the real
model, attention backend and LM head, on a scratch KV cache just large enough for it, and
reads the allocator's peak above what was live before (weights and the scratch cache).
The KV cache then gets what ``--gpu-memory-utilization`` leaves after the weights and
that peak, plus what the forward does not reach: the logits rows' fp32 copies and
log-softmax, and the sampler's working copies (``gpu_budget.unprofiled_bytes``). On CPU the
same dummy step runs (the tests check it there); only a GPU reports a peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from octavo.kv_cache.cache_tensors import KVShape, allocate_kv_caches
from octavo.kv_cache.gpu_budget import StepRows
from octavo.kv_cache.state_tensors import has_state_caches
from octavo.model_executor.paged_model import PagedModel
from octavo.model_executor.step_inputs import add_state_slots, lay_out, step_inputs
from octavo.scheduler.output import ScheduledSequence


@dataclass(frozen=True)
class DummyStep:
    """The profiled step: prefill lengths (one per sequence) and its logits rows."""

    lengths: list[int]
    logits_rows: int

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


def largest_step(rows: StepRows, max_num_seqs: int, max_model_len: int) -> DummyStep:
    """The token budget as prefills over ``min(max_num_seqs, tokens)`` sequences, none
    longer than ``max_model_len`` (more sequences if needed to spend the budget)."""
    count = max(1, min(max_num_seqs, rows.tokens), math.ceil(rows.tokens / max_model_len))
    base, extra = divmod(rows.tokens, count)
    lengths = [base + (1 if index < extra else 0) for index in range(count)]
    return DummyStep([n for n in lengths if n > 0], max(rows.logits, len(lengths)))


def scheduled(step: DummyStep, block_size: int) -> list[ScheduledSequence]:
    """Each dummy sequence on blocks of its own, numbered from 1 (0 is the null block)."""
    sequences, next_block = [], 1
    for seq_id, length in enumerate(step.lengths):
        blocks = math.ceil(length / block_size)
        block_ids = list(range(next_block, next_block + blocks))
        next_block += blocks
        sequences.append(ScheduledSequence(seq_id, [0] * length, 0, block_ids, sample=True))
    return sequences


def dummy_logits(
    model: PagedModel, step: DummyStep, block_size: int, device: torch.device
) -> torch.Tensor:
    """One forward of ``step`` through ``model``; logits of its last ``logits_rows`` tokens."""
    sequences = scheduled(step, block_size)
    layout = lay_out(sequences, block_size)
    first = max(0, step.tokens - step.logits_rows)
    layout.logits_rows = list(range(first, step.tokens))
    inputs = step_inputs(layout, len(step.lengths), device)
    if has_state_caches(model.kv_caches):  # state layers: every sequence on the null slot
        add_state_slots(inputs.meta, sequences, device)
    with torch.inference_mode():
        return model.forward(inputs)


@dataclass(frozen=True)
class CacheSpec:
    """The scratch cache's block size, element type and device."""

    block_size: int
    dtype: torch.dtype
    device: torch.device


def scratch_blocks(step: DummyStep, block_size: int) -> int:
    return 1 + sum(math.ceil(length / block_size) for length in step.lengths)


def measure_step_peak(
    build: Callable[[list[torch.Tensor]], PagedModel],
    shape: KVShape,
    step: DummyStep,
    cache: CacheSpec,
) -> int | None:
    """Bytes the dummy step allocated at its peak above what was live before it (GPU);
    None on other devices, which keep no allocator statistics (the step still runs)."""
    device = cache.device
    caches = allocate_kv_caches(
        shape, scratch_blocks(step, cache.block_size), cache.block_size, cache.dtype, device
    )
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    logits = dummy_logits(build(caches), step, cache.block_size, device)
    peak = None
    if on_gpu:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    del logits, caches
    if on_gpu:
        torch.cuda.empty_cache()
    return peak
