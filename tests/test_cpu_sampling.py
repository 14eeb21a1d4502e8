"""The native CPU sampling kernels against the torch path: ``octavo_cpu.sample_rows`` (the
draw), ``octavo_cpu.argmax_rows`` (greedy rows) and ``octavo_cpu.row_logprobs`` (the
logprob entries, at the end of this file).

The kernel draws by the inverse CDF, so a draw's uniform number picks a place in the row's
distribution. Each check puts one draw in the middle of every kept token's share of the torch
path's distribution (its filters ``apply_top_k_top_p`` and ``apply_min_p``, a softmax, the
cumulative mass in float64): the kernel must return exactly those tokens, which shows it keeps
the tokens the torch path keeps, with the same probabilities. The rows are built so that no
decision is a near tie (margins checked), so the comparison holds on every CPU kind.
"""

from __future__ import annotations

import pytest
import torch

from octavo.sampling import Sampler, SamplingRow
from octavo.sampling.filters import apply_min_p, apply_top_k_top_p
from octavo.sampling.logprobs import pack_logprobs
from octavo.sampling.native_sampler import argmax_indices, draw_rows, native_sampling_ops
from octavo.sampling_params import SamplingParams

VOCAB = 49152  # SmolLM2's: 192 blocks of 256 tokens in the kernel's top-k bound
SHARE_CHECKED = 1e-6  # tokens with a smaller share are not probed (rounding of the masses)
MARGIN = 1e-4  # how far from its threshold every filter decision must be (float32 softmax: ~3e-5)
MOST_PROBES = 512  # kept tokens probed a row (evenly spread over them, the first and last too)


def reference(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """The torch path's distribution for one row (float64)."""
    work = (logits / temperature).unsqueeze(0).clone()
    apply_top_k_top_p(work, [top_k], [top_p])
    apply_min_p(work, [min_p])
    return torch.softmax(work.double(), dim=-1)[0]


def assert_no_near_ties(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> None:
    """The test's own data: each filter's boundary is clear of rounding (a float32 cumulative
    sum over the vocabulary is off by ~1e-5 at worst here)."""
    values = logits.sort(descending=True).values
    if 0 < top_k < logits.numel():
        assert values[top_k - 1] - values[top_k] > 1e-4
        values = values[:top_k]
    if top_p < 1.0:
        probs = torch.softmax(values.double() / temperature, dim=-1)
        mass_before = probs.cumsum(0) - probs
        kept = mass_before < top_p
        if not kept.all():
            assert top_p - mass_before[kept].max() > MARGIN
            assert mass_before[~kept].min() - top_p > MARGIN


def kernel_draws(ops, logits, settings: dict, uniforms: torch.Tensor) -> torch.Tensor:
    """The kernel's token for each uniform number, the row repeated once per number."""
    count = uniforms.numel()
    out = torch.empty(count, dtype=torch.long)
    ops.sample_rows(
        out,
        logits.expand(count, -1).contiguous(),
        torch.full((count,), settings["temperature"]),
        torch.full((count,), settings["top_k"], dtype=torch.long),
        torch.full((count,), settings["top_p"]),
        torch.full((count,), settings["min_p"]),
        uniforms,
    )
    return out


def check_row(ops, logits: torch.Tensor, **settings) -> int:
    """Every kept token with a share >= SHARE_CHECKED is drawn where the torch path puts it;
    returns how many tokens were probed."""
    settings = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **settings}
    probs = reference(logits, **settings)
    lower = probs.cumsum(0) - probs
    probed = (probs >= SHARE_CHECKED).nonzero().flatten()
    if probed.numel() > MOST_PROBES:
        probed = probed[torch.linspace(0, probed.numel() - 1, MOST_PROBES).long()]
    tokens = kernel_draws(ops, logits, settings, lower[probed] + probs[probed] / 2)
    mismatched = (tokens != probed).nonzero().flatten()[:5].tolist()
    assert not mismatched, [(probed[i].item(), tokens[i].item()) for i in mismatched]
    assert (probs[tokens] > 0).all()
    return probed.numel()


def model_like_logits(seed: int, scale: float = 3.0) -> torch.Tensor:
    """A vocabulary-sized row with a few likely tokens and a long tail; ``scale`` 0: 3,000
    nearly equally likely tokens (more than the kernel sorts without a histogram first)."""
    generator = torch.Generator().manual_seed(seed)
    if scale == 0.0:
        logits = torch.randn(VOCAB, generator=generator) - 12.0
        logits[:3000] = torch.randn(3000, generator=generator) * 0.1
        return logits
    logits = torch.randn(VOCAB, generator=generator) * scale
    logits[torch.randint(VOCAB, (20,), generator=generator)] += 3 * scale
    return logits


CASES = {  # name: (seed, scale, settings)
    "temperature": (1, 1.5, {"temperature": 1.3}),
    "top-p": (2, 3.0, {"temperature": 0.7, "top_p": 0.9}),
    "top-k below the blocks": (3, 3.0, {"top_k": 50}),
    "top-k above the blocks, with top-p": (4, 2.0, {"top_k": 700, "top_p": 0.8}),
    "top-p over a flat head (histogram path)": (12, 0.0, {"top_p": 0.95}),
    "min-p": (6, 2.0, {"temperature": 1.5, "min_p": 0.1}),
    "everything": (7, 3.0, {"temperature": 0.8, "top_k": 40, "top_p": 0.7, "min_p": 0.05}),
}


@pytest.mark.parametrize("name", CASES)
def test_the_kernel_draws_the_torch_paths_distribution(ops, name):
    seed, scale, settings = CASES[name]
    logits = model_like_logits(seed, scale)
    temperature, top_k = settings.get("temperature", 1.0), settings.get("top_k", 0)
    assert_no_near_ties(logits, temperature, top_k, settings.get("top_p", 1.0))
    assert check_row(ops, logits, **settings) >= 2


def test_masked_tokens_are_never_drawn(ops):
    logits = model_like_logits(8, 0.5)[:4096]
    logits[::2] = float("-inf")  # a grammar's or min_tokens' mask
    assert check_row(ops, logits, top_p=0.9) > 100
    uniforms = torch.linspace(0, 1 - 1e-9, 1001, dtype=torch.float64)
    tokens = kernel_draws(
        ops, logits, {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}, uniforms
    )
    assert (tokens % 2 == 1).all()


def test_a_tie_group_is_kept_or_dropped_whole(ops):
    logits = torch.tensor([0.3, 0.2, 0.2, 0.2, 0.1]).log()
    assert check_row(ops, logits, top_p=0.6) == 4  # mass before the 0.2s is 0.3 < 0.6: all three
    assert check_row(ops, logits, top_p=0.3) == 1  # mass before them is 0.3: none
    assert check_row(ops, logits, top_k=2) == 4  # tied with the 2nd best: kept too


def test_a_row_with_nothing_allowed_gives_token_zero(ops):
    logits = torch.full((1, 10), float("-inf"))
    settings = {"temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_p": 0.0}
    assert (
        kernel_draws(ops, logits[0], settings, torch.tensor([0.5], dtype=torch.float64)).item() == 0
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"uniform": 1.0}, "uniform must be in"),
        ({"logits_dtype": torch.float64}, "logits must be float32"),
        ({"rows": 3}, "one value per row"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(ops, change, message):
    logits = torch.randn(2, 10, dtype=change.get("logits_dtype", torch.float32))
    rows = change.get("rows", 2)
    with pytest.raises(RuntimeError, match=message):
        ops.sample_rows(
            torch.empty(2, dtype=torch.long),
            logits,
            torch.full((rows,), change.get("temperature", 1.0)),
            torch.zeros(2, dtype=torch.long),
            torch.ones(2),
            torch.zeros(2),
            torch.full((2,), change.get("uniform", 0.5), dtype=torch.float64),
        )


def test_the_cpu_sampler_draws_through_the_kernel_with_each_rows_generator(ops):
    """A seeded row's token is the kernel's at its generator's first float64 number."""
    assert native_sampling_ops(torch.device("cpu")) is not None
    logits = torch.stack([model_like_logits(9), model_like_logits(10)])
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    rows = [SamplingRow(params, [], [], torch.Generator().manual_seed(5 + i)) for i in range(2)]
    tokens = Sampler()(logits, rows).token_ids
    for i, token in enumerate(tokens):
        uniform = torch.rand(1, dtype=torch.float64, generator=torch.Generator().manual_seed(5 + i))
        settings = {"temperature": 0.8, "top_k": 0, "top_p": 0.9, "min_p": 0.0}
        assert kernel_draws(ops, logits[i], settings, uniform).item() == token
    again = [SamplingRow(params, [], [], torch.Generator().manual_seed(5 + i)) for i in range(2)]
    assert draw_rows(ops, logits, again).tolist() == tokens


def argmax_rows(ops, values: torch.Tensor) -> list[int]:
    out = torch.full((values.shape[0],), -1, dtype=torch.long)
    ops.argmax_rows(out, values)
    return out.tolist()


@pytest.mark.parametrize("length", [1, 7, 63, 64, 65, 1000, VOCAB])
def test_argmax_rows_is_torchs_argmax_with_the_first_of_ties(ops, length):
    """Lengths around the kernel's 64-value search blocks and its vector tails; rows read
    with a stride; ties put before and after the block holding the first of them."""
    generator = torch.Generator().manual_seed(length)
    values = torch.randn(6, length + 3, generator=generator)[:, 1 : 1 + length]  # strided rows
    values[1] = -float("inf")  # nothing allowed: token 0, as torch's
    values[2, -1] = 50.0
    values[3, 0] = 50.0
    values[4, length // 2] = values[4, length - 1] = 50.0  # a tie: the first
    values[5] = 1.0  # all tied
    assert argmax_rows(ops, values) == torch.argmax(values, dim=-1).tolist()
    assert argmax_indices(values).tolist() == torch.argmax(values, dim=-1).tolist()


def test_argmax_rows_takes_a_nan_as_the_largest_as_torch_does(ops):
    values = torch.randn(3, 300, generator=torch.Generator().manual_seed(3))
    values[0, 250] = float("nan")  # after the largest value
    values[0, 10] = 40.0
    values[1, 5] = values[1, 200] = float("nan")  # the first NaN
    values[2, 299] = float("nan")  # in the tail
    assert argmax_rows(ops, values) == [250, 5, 299] == torch.argmax(values, dim=-1).tolist()


@pytest.mark.parametrize(
    "values,message",
    [
        (torch.zeros(2, 4, dtype=torch.float64), "float32"),
        (torch.zeros(2, 4).t(), "contiguous rows"),
        (torch.zeros(2, 0), "empty"),
    ],
    ids=["float64", "columns", "empty"],
)
def test_bad_argmax_input_is_refused_with_a_clear_error(ops, values, message):
    with pytest.raises(RuntimeError, match=message):
        ops.argmax_rows(torch.empty(values.shape[0], dtype=torch.long), values)


def test_greedy_rows_fall_back_to_torch_where_the_kernel_does_not_apply():
    """bf16 values and the native path switched off take max(dim=-1): the same answer."""
    values = torch.randn(4, 500, generator=torch.Generator().manual_seed(4))
    expected = torch.argmax(values, dim=-1)
    assert torch.equal(argmax_indices(values.bfloat16()), torch.argmax(values.bfloat16(), -1))
    assert torch.equal(argmax_indices(values, native=False), expected)


def test_logprob_entries_are_the_torch_paths_bit_for_bit(ops):
    """Chosen logprob, rank and the best alternatives packed from the same log_softmax rows
    as ``pack_logprobs`` packs them: equal to the bit, with masked tokens and without."""
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(11)) * 3
    logits[1, ::3] = float("-inf")
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = torch.tensor([0, 3, int(logits[2].argmax()), VOCAB - 1, 77])  # row 1's is masked
    for widest in (0, 1, 5, 20):
        packed = torch.empty(5, 3 + 2 * widest, dtype=torch.long)
        ops.row_logprobs(packed, logprobs, chosen, widest)
        assert torch.equal(packed, pack_logprobs(logprobs, chosen, widest)), widest
    assert packed[2, 2] == 1 and packed[1, 2] > VOCAB // 2  # the best's rank, a masked one's


@pytest.mark.parametrize(
    ("chosen", "widest", "message"),
    [
        ([0, 10], 2, "outside the vocabulary"),
        ([0, 1], 11, "widest must be in"),
        ([0], 2, "one id per row"),
    ],
)
def test_bad_logprob_input_is_refused_with_a_clear_error(ops, chosen, widest, message):
    packed = torch.empty(2, 3 + 2 * widest, dtype=torch.long)
    with pytest.raises(RuntimeError, match=message):
        ops.row_logprobs(packed, torch.zeros(2, 10), torch.tensor(chosen), widest)
