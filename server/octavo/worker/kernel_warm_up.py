"""Every Triton kernel variant a step can launch, compiled before the first request.

Triton compiles a kernel once for each set of its compile-time options (``tl.constexpr``
values, warps, stages), and several options follow the step's shape: the prefill
attention's query tile (16, 32 or 64 rows, from the step's longest chunk), the decode
merge's split count (a power of two, from the step's rows and block-table width), the
quantized and MoE GEMMs' row tiles (from the step's tokens). The start-up steps reach only
some of them (the memory profile's largest prefill, the decode graphs' captures); each
other one would compile in the middle of serving, a second or so with the host stalled.
On an H200 the prefill steps of nano-vllm's offline shape ran 82 ms each on average, the
host as long as the GPU, the mark of kernels compiling mid-step
(``bench-results/reference/2026-11-28-h200-gpu``).

The warm-up runs one dummy step per shape class through the model on the KV cache itself,
before any request holds a block: prefills of one sequence at every power of two of tokens
up to the step budget (each query tile, each row-tile threshold), and decode steps of one
row whose block table is every power of two of blocks wide up to the longest sequence
(each split count of the eager decode launch, which steps with a prefill part take). All
dummy sequences write to block 1 and read it again wherever their tables point: what they
leave there is garbage in a free block. Then the sampler's top-p kernel runs on the last
step's logits. Triton keeps what it compiled on disk, so a later start only loads it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch

from octavo.model_executor.dummy_steps import DummyShape, dummy_inputs, prompt_chunks
from octavo.model_executor.paged_model import PagedModel

logger = logging.getLogger(__name__)

WARM_UP_TOP_P = 0.9


@dataclass(frozen=True)
class StepLimits:
    """The largest step the scheduler makes and the longest sequence it holds."""

    max_tokens: int  # the token budget of one step (``max_num_batched_tokens``)
    max_model_len: int
    block_size: int


def powers_of_two_up_to(limit: int) -> list[int]:
    """1, 2, 4, ... below ``limit``, then ``limit`` itself (nothing when it is below 1)."""
    values = [1 << shift for shift in range(max(0, limit).bit_length()) if 1 << shift < limit]
    return [*values, limit] if limit >= 1 else []


def prefill_steps(limits: StepLimits) -> list[DummyShape]:
    """A prompt of every power of two of tokens up to the step budget, uncached; one past
    ``max_model_len`` is spread over sequences of at most that many tokens."""
    steps = []
    for tokens in powers_of_two_up_to(limits.max_tokens):
        chunks = prompt_chunks(tokens, limits.max_model_len)
        steps.append(DummyShape(tuple((0, chunk) for chunk in chunks)))
    return steps


def decode_steps(limits: StepLimits) -> list[DummyShape]:
    """One decoding row whose block table is every power of two of blocks wide, up to the
    longest sequence's (its position stays inside ``max_model_len``)."""
    widest = math.ceil(limits.max_model_len / limits.block_size)
    steps = []
    for width in powers_of_two_up_to(widest):
        position = min(width * limits.block_size, limits.max_model_len) - 1
        steps.append(DummyShape(((position, 1),)))
    return steps


def warm_up_steps(limits: StepLimits) -> list[DummyShape]:
    return prefill_steps(limits) + decode_steps(limits)


def run_step(model: PagedModel, step: DummyShape) -> torch.Tensor:
    """One forward of ``step`` (logits of each sequence's last token)."""
    inputs = dummy_inputs(model, step)
    with torch.inference_mode():
        return model.forward(inputs)


def warm_up_sampler(logits: torch.Tensor) -> None:
    """The top-p threshold kernel (one variant per vocabulary) on real logits."""
    from octavo.sampling.top_p_threshold import top_p_thresholds

    probs = torch.softmax(logits.float(), dim=-1)
    top_p = torch.full((probs.shape[0],), WARM_UP_TOP_P, device=probs.device)
    top_p_thresholds(probs, top_p)


def warm_up_kernels(model: PagedModel, limits: StepLimits) -> int:
    """Run every warm-up step through ``model`` (then the sampler); the steps run. A step
    that fails ends the warm-up with a warning: serving compiles what is left, as before."""
    start = time.perf_counter()
    steps, done, logits = warm_up_steps(limits), 0, None
    try:
        for step in steps:
            logits = run_step(model, step)
            done += 1
        if isinstance(logits, torch.Tensor) and logits.dim() == 2:
            warm_up_sampler(logits)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
    except Exception:  # an optimisation only: start-up goes on
        logger.warning(
            "kernel warm-up stopped after %d of %d steps", done, len(steps), exc_info=True
        )
    seconds = time.perf_counter() - start
    logger.info(
        "kernel warm-up: %d steps in %.1f s (each shape class compiled once)", done, seconds
    )
    return done
