"""Prompt lookup ("ngram") proposals: the tokens that followed the latest earlier
occurrence of the sequence's last n tokens, for the longest n in [min, max] that occurs.

Cheap (no model), and strong wherever the output quotes its input: editing, extraction,
summaries that reuse phrases, code that repeats identifiers. A sequence without a match
gets no proposal and decodes one token as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
            start = _latest_earlier_match(tokens, size)
            if start is not None:
                follow = start + size
                return tokens[follow : follow + self.num_speculative_tokens].tolist()
        return []


def _latest_earlier_match(tokens: np.ndarray, size: int) -> int | None:
    """Start of the latest window of ``size`` tokens before the suffix that equals it."""
    suffix = tokens[-size:]
    # windows of all tokens but the last: each has at least one token after it
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], size)
    hits = np.flatnonzero((windows == suffix).all(axis=1))
    return int(hits[-1]) if len(hits) else None
