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
        for size in range(
            min(self.prompt_lookup_max, len(tokens) - 1), self.prompt_lookup_min - 1, -1
        ):
            start = _latest_earlier_match(tokens, size, self.num_speculative_tokens)
            if start is not None:
                follow = start + size
                return tokens[follow : follow + self.num_speculative_tokens].tolist()
        return []


def _latest_earlier_match(tokens: np.ndarray, size: int, wanted: int) -> int | None:
    """Start of the latest window of ``size`` tokens before the suffix that equals it and
    is followed by ``wanted`` tokens; failing that, the latest one (in a loop shorter than
    ``wanted`` the latest match has fewer tokens after it than an earlier one)."""
    suffix = tokens[-size:]
    # windows of all tokens but the last: each has at least one token after it
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], size)
    hits = np.flatnonzero((windows == suffix).all(axis=1))
    if not len(hits):
        return None
    followed = hits[hits + size + wanted <= len(tokens)]
    return int(followed[-1]) if len(followed) else int(hits[-1])


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
