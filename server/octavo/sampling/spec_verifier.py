"""Verifying each speculating sequence's proposals against the target's logits rows.

A sequence that proposed ``k`` tokens has ``k + 1`` logits rows: row ``i`` predicts the
token after proposal ``i`` (row 0: after its last kept token). Row ``i`` is processed as
the sampler would process it had proposals ``0..i-1`` been generated (penalties and
``min_tokens`` see them), then ``rejection_sampler`` keeps a prefix of the proposals and
adds one token of the target's own. Logprobs, when asked for, are the raw rows' (as for
ordinary sampling).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from octavo.sampling.logprobs import logprob_entries
from octavo.sampling.rejection_sampler import keep_matching, verify_sampled
from octavo.sampling.sampler import SamplingRow, row_argmax, target_probabilities
from octavo.sampling.token_logprobs import TokenLogprobs


@dataclass
class Proposal:
    """One sequence's proposals and where its ``len(tokens) + 1`` logits rows start."""

    seq_id: int
    row: SamplingRow  # the sequence's sampling settings and history so far
    tokens: list[int]
    first_row: int

    def position_rows(self) -> list[SamplingRow]:
        """The sampling row of each position, its history extended by the proposals before it."""
        history = self.row.output_token_ids
        return [
            dataclasses.replace(self.row, output_token_ids=history + self.tokens[:i])
            for i in range(len(self.tokens) + 1)
        ]


@dataclass
class Verified:
    seq_id: int
    token_ids: list[int]  # the kept proposals, then the target's token
    logprobs: list[TokenLogprobs | None]


def verify_proposals(logits: torch.Tensor, proposals: list[Proposal]) -> list[Verified]:
    """Each sequence's kept tokens (1 to k + 1), distributed exactly as the target's."""
    index = [p.first_row + i for p in proposals for i in range(len(p.tokens) + 1)]
    rows = logits[torch.tensor(index, dtype=torch.long, device=logits.device)]
    position_rows = [row for p in proposals for row in p.position_rows()]
    offsets = _offsets(proposals)
    kept = _keep(rows, proposals, offsets, position_rows)
    return [
        Verified(p.seq_id, tokens, _logprobs(rows, offset, p, tokens))
        for p, tokens, offset in zip(proposals, kept, offsets, strict=True)
    ]


def _keep(
    rows: torch.Tensor,
    proposals: list[Proposal],
    offsets: list[int],
    position_rows: list[SamplingRow],
) -> list[list[int]]:
    if all(_plain_greedy(row) for row in position_rows):  # one argmax for every row
        best = row_argmax(rows)
        return [
            keep_matching(best[o : o + len(p.tokens) + 1], p.tokens)
            for p, o in zip(proposals, offsets, strict=True)
        ]
    probs = target_probabilities(rows, position_rows)
    kept = []
    for proposal, offset in zip(proposals, offsets, strict=True):
        target = probs[offset : offset + len(proposal.tokens) + 1]
        kept.append(verify_sampled(target, proposal.tokens, None, proposal.row.generator))
    return kept


def _plain_greedy(row: SamplingRow) -> bool:
    return row.params.is_greedy and not row.params.any_penalty and not row.blocked_token_ids()


def _offsets(proposals: list[Proposal]) -> list[int]:
    offsets, total = [], 0
    for proposal in proposals:
        offsets.append(total)
        total += len(proposal.tokens) + 1
    return offsets


def _logprobs(
    rows: torch.Tensor, offset: int, proposal: Proposal, tokens: list[int]
) -> list[TokenLogprobs | None]:
    wanted = proposal.row.params.logprobs
    if wanted is None:
        return [None] * len(tokens)
    return logprob_entries(rows[offset : offset + len(tokens)], tokens, [wanted] * len(tokens))
