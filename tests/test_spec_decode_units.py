"""Speculative decoding's parts on their own: the config's parsing and errors, n-gram
proposals, and verification — greedy keeps the target's argmax, and sampled output is
distributed exactly as the target's (chi-square over many seeded draws, for a draft
model's proposals and for deterministic n-gram ones)."""

from __future__ import annotations

import pytest
import torch

from octavo.sampling.rejection_sampler import verify_greedy, verify_sampled
from octavo.spec_decode.config import SpeculativeConfig
from octavo.spec_decode.ngram_proposer import NgramProposer

VOCAB = 5
CHI_SQUARE_CRITICAL_4_DOF = 18.47  # P(chi2 > 18.47) = 0.001 with 4 degrees of freedom
DRAWS = 20_000


def test_config_parses_vllm_spelling():
    ngram = SpeculativeConfig.parse(
        '{"method": "ngram", "num_speculative_tokens": 3, '
        '"prompt_lookup_max": 5, "prompt_lookup_min": 2}'
    )
    assert (
        ngram.method,
        ngram.num_speculative_tokens,
        ngram.prompt_lookup_min,
        ngram.prompt_lookup_max,
    ) == ("ngram", 3, 2, 5)
    draft = SpeculativeConfig.parse({"model": "/models/draft", "num_speculative_tokens": 4})
    assert draft.method == "draft_model" and draft.model == "/models/draft"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be"),
        ('{"method": "medusa", "num_speculative_tokens": 2}', "method 'medusa' is not one of"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "k": 1}', "unknown keys"),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, '
            '"prompt_lookup_max": 2}',
            "prompt_lookup_min",
        ),
        ("[1, 2]", "expected a JSON object"),
        ("{nope", "not JSON"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', 'needs "model"'),
    ],
)
def test_config_errors_name_the_problem(raw, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(raw)


def test_ngram_proposes_what_followed_the_latest_longest_match():
    proposer = NgramProposer(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
    #            0  1  2  3  4  5  6  7  8  9
    sequence = [7, 1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 1, 2, 3]
    assert proposer.propose(sequence) == [4, 5, 1]  # "1 2 3" last seen at 6..8
    assert proposer.propose([1, 2, 3, 4]) == []  # nothing repeats
    assert NgramProposer(2, 2, 2).propose([5, 6, 8, 5, 6]) == [8, 5]
    assert NgramProposer(4, 1, 1).propose([5, 6, 5]) == [6, 5]  # capped by what follows


def test_greedy_verification_keeps_the_argmax():
    logits = torch.full((4, VOCAB), -1.0)
    for position, best in enumerate([2, 3, 1, 4]):
        logits[position, best] = 1.0
    assert verify_greedy(logits, [2, 3, 1]) == [2, 3, 1, 4]  # all accepted + bonus
    assert verify_greedy(logits, [2, 0, 1]) == [2, 3]  # the first mismatch is replaced


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def random_distributions(rows: int, generator: torch.Generator) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, VOCAB, generator=generator) * 1.5, dim=-1)


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_sampled_verification_keeps_the_target_distribution(draft):
    generator = torch.Generator().manual_seed(0)
    target = random_distributions(3, generator)  # positions 0, 1 and the bonus
    proposals = random_distributions(2, generator)
    first = torch.zeros(VOCAB)
    second_after_accept = torch.zeros(VOCAB)
    fixed = [1, 3]  # n-gram proposals are the same every time
    for _ in range(DRAWS):
        if draft == "model":
            proposed = [
                int(torch.multinomial(proposals[i], 1, generator=generator)) for i in (0, 1)
            ]
            emitted = verify_sampled(target, proposed, proposals, generator)
        else:
            proposed = fixed
            emitted = verify_sampled(target, proposed, None, generator)
        first[emitted[0]] += 1
        if emitted[0] == proposed[0] and len(emitted) > 1:  # the target's next distribution
            second_after_accept[emitted[1]] += 1
    assert chi_square(first, target[0]) < CHI_SQUARE_CRITICAL_4_DOF
    assert second_after_accept.sum() > 800  # expected ≈ 967 (n-gram: DRAWS × p_0(1))
    assert chi_square(second_after_accept, target[1]) < CHI_SQUARE_CRITICAL_4_DOF
