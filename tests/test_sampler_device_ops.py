"""The sampler on an accelerator (issue 40 §4): no host sync inside a step, one read-back.

* top-p by bisection (``top_p_threshold``, its Triton kernel under ``TRITON_INTERPRET``
  here) keeps exactly the tokens the CPU's growing search keeps, ties included;
* ``min_tokens`` blocking is one batched write, with the same result and error;
* logprobs travel packed beside the ids, bit-exact;
* a whole mixed step on ``meta`` "logits" (``FakeAccelerator``) reads the device once.

The last test repeats the checks on a CUDA GPU when there is one (``make gpu-check``).
"""

from __future__ import annotations

import math
import warnings
from typing import ClassVar

import pytest
import torch

from fake_accelerator import _HOST_READS, FakeAccelerator
from octavo.sampling import Sampler, SamplingRow
from octavo.sampling.filters import _growing_search_thresholds, apply_top_k_top_p
from octavo.sampling.logprobs import pack_logprobs, unpack_logprobs
from octavo.sampling.penalties import mask_token_rows, mask_tokens
from octavo.sampling.random_draws import generator_for
from octavo.sampling.top_p_threshold import bisect_thresholds
from octavo.sampling.top_p_triton import triton_thresholds
from octavo.sampling_params import SamplingParams

# Not p within float32 rounding of a row's mass (say 1 - 1e-6): the two searches sum the
# mass in different orders, so there they may disagree by a token (top_p_threshold doc).
TOP_PS = [1e-6, 0.1, 0.5, 0.8, 0.9, 0.95, 0.99, 0.9999]


def tied_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Random logits rounded to a coarse grid, so that many tokens tie."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.tensor([0.3, 1.0, 3.0, 8.0]).repeat(rows // 4 + 1)[:rows, None]
    return (torch.randn(rows, vocab, generator=generator) * scales * 4).round() / 4


def kept_by_growing_search(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    return probs >= _growing_search_thresholds(probs, top_p).unsqueeze(1)


@pytest.mark.parametrize("vocab", [7, 1000, 5000])
def test_bisection_keeps_what_the_growing_search_keeps(vocab: int) -> None:
    probs = torch.softmax(tied_logits(len(TOP_PS), vocab, seed=vocab), dim=1)
    top_p = torch.tensor(TOP_PS)
    kept = probs >= bisect_thresholds(probs, top_p).unsqueeze(1)
    assert torch.equal(kept, kept_by_growing_search(probs, top_p))


def test_bisection_keeps_a_certain_token_and_all_of_a_flat_row() -> None:
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    thresholds = bisect_thresholds(probs, torch.tensor([0.5, 0.6, 0.1]))
    assert thresholds.tolist() == pytest.approx([1.0, 0.25, 1 / 3])


def test_the_triton_kernel_finds_the_same_thresholds() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1
    probs = torch.softmax(tied_logits(4, 3000, seed=5), dim=1)
    top_p = torch.tensor([0.3, 0.9, 0.99, 0.5])
    expected = bisect_thresholds(probs, top_p)
    found = triton_thresholds(probs.to(device), top_p.to(device)).cpu()
    assert torch.equal(found, expected)


def test_batched_blocking_matches_per_row_blocking() -> None:
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(6))
    blocked = [[3, 7], [], [0, 29, 3], [5]]
    expected = logits.clone()
    for i, ids in enumerate(blocked):
        mask_tokens(expected, i, ids)
    batched = logits.clone()
    mask_token_rows(batched, range(4), blocked)
    assert torch.equal(batched, expected)
    assert int(torch.isinf(batched).sum()) == 6
    with pytest.raises(ValueError, match="token ids to block must be in"):
        mask_token_rows(batched, range(2), [[1], [30]])


def test_logprobs_travel_bit_exact_beside_the_ids() -> None:
    logprobs = torch.log_softmax(torch.randn(3, 40, generator=torch.Generator().manual_seed(7)), 1)
    logprobs[1, 5] = float("-inf")
    logprobs[2, 9] = 1e-40  # a subnormal float32
    chosen = torch.tensor([0, 5, 9])
    entries = unpack_logprobs(pack_logprobs(logprobs, chosen, widest=3), [3, 0, 1])
    for i, entry in enumerate(entries):
        token = int(chosen[i])
        assert entry.token_id == token and entry.logprob == logprobs[i, token].item()
        assert entry.rank == int((logprobs[i] > logprobs[i, token]).sum()) + 1
    assert entries[1].logprob == -math.inf and entries[1].top == []
    values, indices = logprobs[0].topk(3)
    assert entries[0].top == list(zip(indices.tolist(), values.tolist(), strict=True))


def mixed_rows(seeded_on: torch.device | None) -> list[SamplingRow]:
    """Every stage of a step: greedy, top-k/top-p/min-p, penalties, min_tokens, logprobs."""
    settings = [
        {"temperature": 0.0, "logprobs": 2},
        {"temperature": 0.0, "repetition_penalty": 1.2, "min_tokens": 4},
        {"temperature": 0.8, "top_p": 0.9, "logprobs": 0, "seed": 3},
        {"top_k": 5, "top_p": 0.7, "min_p": 0.05, "presence_penalty": 0.5},
        {"frequency_penalty": 0.4, "min_tokens": 2, "stop_token_ids": [4]},
    ]
    return [
        SamplingRow(
            params=SamplingParams(**params),
            prompt_token_ids=[1, 2, 3],
            output_token_ids=[2, 9, 9],
            generator=(
                generator_for(3, seeded_on) if seeded_on is not None and "seed" in params else None
            ),
            eos_token_ids=frozenset({0}),
        )
        for params in settings
    ]


class ReadBacks(FakeAccelerator):
    """``FakeAccelerator`` that also counts what makes the host wait for the device: reads
    back, and ``tensor[index] = number`` (CUDA copies the number over synchronously)."""

    READS: ClassVar[set] = {
        torch.Tensor.cpu,
        torch.Tensor.numpy,
        torch.Tensor.nonzero,
        torch.nonzero,
    }

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.device.type != "cpu":
            if func in self.READS or func in _HOST_READS or _sets_a_number(func, args):
                self.count += 1
            if func is torch.Tensor.cpu:
                return torch.zeros(first.shape, dtype=first.dtype)
        return super().__torch_function__(func, types, args, kwargs)


def _sets_a_number(func, args: tuple) -> bool:
    return func is torch.Tensor.__setitem__ and isinstance(args[2], (int, float))


def test_a_mixed_step_reads_the_device_back_once() -> None:
    meta = torch.device("meta")
    logits = torch.empty(5, 50, device=meta)
    counter = ReadBacks()
    with counter:
        result = Sampler()(logits, mixed_rows(seeded_on=meta))
    assert len(result.token_ids) == 5 and result.logprobs[0] is not None
    assert counter.count == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_sampler_syncs_once_and_agrees_with_the_cpu(monkeypatch) -> None:
    """The one wait is on the read-back's event (pinned copy); nothing else synchronises
    (torch's sync debug mode flags stream syncs and pageable copies, not event waits)."""
    cuda = torch.device("cuda")
    logits = torch.randn(5, 49152, generator=torch.Generator().manual_seed(8))
    on_gpu = logits.to(cuda)
    Sampler()(on_gpu, mixed_rows(seeded_on=cuda))  # warm-up: Triton compiles, pools fill
    torch.cuda.synchronize()
    waits = []
    event_wait = torch.cuda.Event.synchronize
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda e: waits.append(event_wait(e)))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = Sampler()(on_gpu, mixed_rows(seeded_on=cuda))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [str(w.message) for w in caught if "synchronizing" in str(w.message)] == []
    assert len(waits) == 1
    expected = Sampler()(logits, mixed_rows(seeded_on=None))
    assert result.token_ids[:2] == expected.token_ids[:2]  # the greedy rows
    entry, wanted = result.logprobs[0], expected.logprobs[0]
    assert (entry.token_id, entry.rank) == (wanted.token_id, wanted.rank)
    assert [t for t, _ in entry.top] == [t for t, _ in wanted.top]
    assert entry.logprob == pytest.approx(wanted.logprob, abs=1e-4)
    logits = tied_logits(5, 49152, seed=8)
    filtered, reference = logits.to(cuda), logits.clone()
    apply_top_k_top_p(filtered, [0, 50, 0, 0, 0], [0.9, 0.8, 0.5, 0.99, 1e-6])
    apply_top_k_top_p(reference, [0, 50, 0, 0, 0], [0.9, 0.8, 0.5, 0.99, 1e-6])
    assert torch.equal(filtered.isfinite().cpu(), reference.isfinite())
