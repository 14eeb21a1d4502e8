"""Prompt lookup ("ngram") proposals: the tokens that followed the latest earlier
occurrence of the sequence's last n tokens (the latest with k tokens after it, if any),
for the longest n in [min, max] that occurs.

Cheap (no model), and strong wherever the output quotes its input: editing, extraction,
summaries that reuse phrases, code that repeats identifiers. A sequence without a match
gets no proposal and decodes one token as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from octavo.scheduler.output import SchedulerOutput


@dataclass(frozen=True)
class NgramProposer:
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4

    def propose(self, token_ids: list[int]) -> list[int]:
        """Up to ``num_speculative_tokens`` proposed next tokens ([] when nothing matches)."""
        tokens = np.asarray(token_ids, dtype=np.int64)
        ends = _longest_earlier_match(tokens, self.prompt_lookup_min, self.prompt_lookup_max)
        if ends is None:
            return []
        follow = _preferred_end(ends, len(tokens), self.num_speculative_tokens) + 1
        return tokens[follow : follow + self.num_speculative_tokens].tolist()


def _longest_earlier_match(tokens: np.ndarray, shortest: int, longest: int) -> np.ndarray | None:
    """Where the earlier occurrences of the longest suffix of n tokens, n in [shortest,
    longest], end (each is followed by at least one token); None if there is none."""
    length = len(tokens)
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # windows of 1 that match
    best = ends if shortest <= 1 and len(ends) else None
    for size in range(2, min(longest, length - 1) + 1):
        ends = ends[ends >= size - 1]
        ends = ends[tokens[ends - size + 1] == tokens[length - size]]
        if not len(ends):
            break
        if size >= shortest:
            best = ends
    return best


def _preferred_end(ends: np.ndarray, length: int, wanted: int) -> int:
    """The latest match followed by ``wanted`` tokens; failing that, the latest (in a
    loop shorter than ``wanted`` the latest match has fewer tokens after it)."""
    followed = ends[ends + 1 + wanted <= length]
    return int(followed[-1]) if len(followed) else int(ends[-1])


@dataclass(frozen=True)
class NgramStepProposer:
    """The runner's proposer for ``method: ngram``: each sequence looks in its own tokens."""

    ngram: NgramProposer

    def propose_step(
        self, step: SchedulerOutput, seq_ids: list[int], history: Callable[[int], list[int]]
    ) -> dict[int, list[int]]:
        proposals = {seq_id: self.ngram.propose(history(seq_id)) for seq_id in seq_ids}
        return {seq_id: tokens for seq_id, tokens in proposals.items() if tokens}

    def forget(self, seq_ids: list[int]) -> None:
        """Nothing is kept between steps."""
