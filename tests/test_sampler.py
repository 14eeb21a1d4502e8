"""Sampler: greedy/seeded sampling, min_tokens, penalties, filters and logprobs."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from octavo.sampling import Sampler, SamplingRow
from octavo.sampling.filters import apply_min_p, apply_top_k_top_p
from octavo.sampling.penalties import (
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
)
from octavo.sampling_params import SamplingParams


def row(
    output: list[int] | None = None,
    prompt: list[int] | None = None,
    seed: int | None = None,
    eos: frozenset[int] = frozenset(),
    **params: object,
) -> SamplingRow:
    """A SamplingRow with a fresh seeded generator when ``seed`` is given."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return SamplingRow(
        params=SamplingParams(seed=seed, **params),
        prompt_token_ids=prompt or [],
        output_token_ids=output or [],
        generator=generator,
        eos_token_ids=eos,
    )


@pytest.fixture(params=[True, False], ids=["native", "torch"])
def native(request) -> bool:
    """Sampled rows on the CPU: the native kernel (``native_sampler``), or the torch path's
    filters and exponential race (what a GPU runs, and the CPU without the kernels)."""
    return request.param


def draws(
    probs: list[float], count: int = 4000, native: bool = True, **params: object
) -> Counter[int]:
    """Sample ``count`` times (as one batch) from a distribution given as probabilities."""
    torch.manual_seed(1234)
    logits = torch.tensor(probs).log().expand(count, -1).contiguous()
    result = Sampler(native)(logits, [row(**params) for _ in range(count)])
    return Counter(result.token_ids)


def test_pure_greedy_batch_is_argmax_for_any_dtype() -> None:
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    rows = [row(temperature=0.0) for _ in range(6)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        result = Sampler()(logits.to(dtype), rows)
        assert result.token_ids == logits.to(dtype).float().argmax(-1).tolist()
        assert result.logprobs == [None] * 6


def test_top_k_one_equals_greedy_and_mixed_batch() -> None:
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(1))
    rows = [row(top_k=1) if i % 2 else row(temperature=0.0) for i in range(8)]
    result = Sampler()(logits, rows)
    assert result.token_ids == logits.argmax(-1).tolist()


def test_caller_logits_are_not_modified() -> None:
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(2))
    before = logits.clone()
    rows = [
        row(output=[1, 2, 2], repetition_penalty=1.5, frequency_penalty=1.0, top_p=0.5),
        row(output=[0], min_tokens=3, stop_token_ids=[5], temperature=0.0),
    ]
    Sampler()(logits, rows)
    assert torch.equal(logits, before)


def _seeded_run(
    seed: int, position: int, others: list[SamplingRow], native: bool = True, steps: int = 12
) -> list:
    """Sample ``steps`` tokens for a seeded row placed at ``position`` among ``others``."""
    logits_gen = torch.Generator().manual_seed(99)
    target = row(seed=seed, temperature=0.9, top_p=0.95)
    rows = list(others)
    rows.insert(position, target)
    tokens = []
    for _ in range(steps):
        step_logits = torch.randn(len(rows), 500)  # other rows' logits vary freely
        step_logits[position] = torch.randn(500, generator=logits_gen)
        tokens.append(Sampler(native)(step_logits, rows).token_ids[position])
    return tokens


def test_same_seed_gives_same_tokens_regardless_of_batch(native: bool) -> None:
    alone = _seeded_run(seed=7, position=0, others=[], native=native)
    others = [row(), row(seed=3), row(temperature=0)]
    batched = _seeded_run(seed=7, position=2, others=others, native=native)
    reordered = _seeded_run(seed=7, position=1, others=[row(seed=5), row()], native=native)
    assert alone == batched == reordered
    assert _seeded_run(seed=8, position=0, others=[], native=native) != alone


def test_min_tokens_blocks_eos_and_stop_tokens() -> None:
    logits = torch.zeros(1, 10)
    logits[0, 9] = 10.0  # EOS is by far the best token
    logits[0, 8] = 9.0  # then a stop token
    eos = frozenset({9})
    blocked = row(output=[1], min_tokens=3, eos=eos, stop_token_ids=[8], temperature=0.0)
    assert Sampler()(logits, [blocked]).token_ids == [0]
    sampled = [row(output=[1], min_tokens=3, eos=eos, stop_token_ids=[8]) for _ in range(200)]
    tokens = Sampler()(logits.expand(200, -1), sampled).token_ids
    assert not {8, 9} & set(tokens)
    done = row(output=[1, 2, 3], min_tokens=3, eos=eos, temperature=0.0)
    assert Sampler()(logits, [done]).token_ids == [9]
    ignoring = row(output=[1], min_tokens=3, eos=eos, ignore_eos=True, temperature=0.0)
    assert Sampler()(logits, [ignoring]).token_ids == [9]


def test_repetition_penalty_follows_hf_convention() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    apply_repetition_penalty(logits, [0], [[0, 1, 1]], [2.0])
    assert logits.tolist() == [[1.0, -2.0, 0.5, 3.0]]


def test_repetition_penalty_uses_prompt_and_output_in_sampler() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    rows = [
        row(prompt=[0], repetition_penalty=2.0, temperature=0.0),
        row(output=[0], repetition_penalty=2.0, temperature=0.0),
    ]
    assert Sampler()(logits, rows).token_ids == [1, 1]


def test_presence_and_frequency_penalties_scale_with_counts() -> None:
    logits = torch.zeros(2, 4)
    apply_presence_frequency_penalties(logits, [1], [[1, 1, 1, 2]], [0.25], [0.5])
    assert logits[0].tolist() == [0.0] * 4
    assert logits[1].tolist() == [0.0, -1.75, -0.75, 0.0]


def test_frequency_penalty_ignores_prompt_tokens() -> None:
    logits = torch.tensor([[2.0, 1.5, 0.0]])
    prompt_only = row(prompt=[0, 0, 0], frequency_penalty=2.0, temperature=0.0)
    in_output = row(output=[0], frequency_penalty=2.0, temperature=0.0)
    assert Sampler()(logits, [prompt_only]).token_ids == [0]
    assert Sampler()(logits, [in_output]).token_ids == [1]


def test_top_k_keeps_only_the_best_tokens(native: bool) -> None:
    counts = draws([0.1, 0.4, 0.2, 0.3], native=native, top_k=2)
    assert set(counts) == {1, 3}
    assert counts[1] / sum(counts.values()) == pytest.approx(4 / 7, abs=0.03)


def test_top_p_keeps_smallest_set_reaching_p(native: bool) -> None:
    # Mass before token 2 is 0.7 < 0.8 (kept); before token 3 it is 0.85 (dropped).
    counts = draws([0.4, 0.3, 0.15, 0.1, 0.05], native=native, top_p=0.8)
    assert set(counts) == {0, 1, 2}
    assert counts[0] / sum(counts.values()) == pytest.approx(0.4 / 0.85, abs=0.03)
    assert set(draws([0.4, 0.3, 0.15, 0.1, 0.05], native=native, top_p=0.05)) == {0}


def test_min_p_drops_tokens_below_fraction_of_best(native: bool) -> None:
    counts = draws([0.5, 0.3, 0.15, 0.05], native=native, min_p=0.2)  # threshold 0.1
    assert set(counts) == {0, 1, 2}


def test_temperature_sharpens_distribution(native: bool) -> None:
    probs = [0.5, 0.3, 0.2]
    cold = draws(probs, native=native, temperature=0.2)
    assert cold[0] / sum(cold.values()) > 0.9


def _reference_top_k_top_p(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """Straightforward sort-based top-k then top-p, returning the kept-token mask."""
    values, order = logits.sort(descending=True)
    if 0 < k < logits.numel():
        values[k:] = float("-inf")
    probs = values.softmax(-1)
    keep = (probs.cumsum(-1) - probs) < p
    keep &= values > float("-inf")
    mask = torch.zeros_like(keep)
    mask[order] = keep
    return mask


def test_top_k_top_p_match_sort_based_reference_on_wide_vocab() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 3000, generator=generator) * torch.tensor([[0.2, 1, 4, 1, 2, 0.5]]).T
    ks, ps = [0, 0, 0, 100, 700, 5], [0.9, 0.5, 0.95, 0.8, 0.3, 1.0]
    filtered = logits.clone()
    apply_top_k_top_p(filtered, ks, ps)
    for i in range(6):
        expected = _reference_top_k_top_p(logits[i].clone(), ks[i], ps[i])
        assert torch.equal(filtered[i] > float("-inf"), expected), f"row {i}"


def test_min_p_filter_directly() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]).log()
    apply_min_p(logits, [0.0, 0.5])
    assert torch.isfinite(logits[0]).all()
    assert torch.isfinite(logits[1]).tolist() == [True, True, False, False]


def test_logprobs_come_from_raw_logits() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(4))
    rows = [
        row(output=[1, 1], logprobs=5, repetition_penalty=1.3, temperature=0.7, seed=1),
        row(logprobs=0, temperature=0.0),
        row(temperature=0.0),
    ]
    result = Sampler()(logits, rows)
    expected = torch.log_softmax(logits, dim=-1)
    for i in (0, 1):
        entry, token = result.logprobs[i], result.token_ids[i]
        assert entry is not None and entry.token_id == token
        assert entry.logprob == pytest.approx(expected[i, token].item(), abs=1e-5)
        assert entry.rank == int((expected[i] > expected[i, token]).sum()) + 1
    top = result.logprobs[0].top
    values, indices = expected[0].topk(5)
    assert [t for t, _ in top] == indices.tolist()
    assert [v for _, v in top] == pytest.approx(values.tolist(), abs=1e-5)
    assert result.logprobs[1].top == [] and result.logprobs[1].rank == 1
    assert result.logprobs[2] is None


def test_bad_inputs_raise_value_error() -> None:
    with pytest.raises(ValueError, match="rows"):
        Sampler()(torch.zeros(2, 5), [row()])
    with pytest.raises(ValueError, match="shape"):
        Sampler()(torch.zeros(5), [row()])
    with pytest.raises(ValueError, match="history"):
        Sampler()(torch.zeros(1, 5), [row(output=[7], presence_penalty=1.0)])
    assert Sampler()(torch.zeros(0, 5), []).token_ids == []
