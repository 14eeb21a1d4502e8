"""One sequence's place in its grammar, and the batched bitmask applied to the logits.

Each constrained sequence has an xgrammar ``GrammarMatcher``: before a step it writes the
tokens allowed next into its row of a bitmask; after the step succeeds it accepts the
sampled token. A sequence created mid-way (a fork of ``n > 1``) replays its tokens. The
matcher keeps its history, so speculative decoding can roll rejected tokens back.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


class GrammarState:
    def __init__(self, compiled, output_token_ids: list[int]) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        for token in output_token_ids:
            self.accept(token)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> None:
        if self.matcher.is_terminated():
            return  # the grammar is complete: only stop tokens could follow
        if not self.matcher.accept_token(token):
            logger.warning("token %d is outside the grammar; the constraint is lost", token)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


def apply_grammar_bitmasks(logits: torch.Tensor, states: list[GrammarState | None]) -> torch.Tensor:
    """A float32 copy of ``logits`` with every token a row's grammar forbids at -inf
    (rows without a grammar untouched)."""
    import xgrammar as xgr

    rows = [i for i, state in enumerate(states) if state is not None]
    bitmask = xgr.allocate_token_bitmask(len(states), logits.shape[-1])
    for row in rows:
        states[row].fill_bitmask(bitmask, row)
    masked = logits.float().clone() if logits.dtype == torch.float32 else logits.float()
    xgr.apply_token_bitmask_inplace(masked, bitmask.to(logits.device), indices=rows)
    return masked
