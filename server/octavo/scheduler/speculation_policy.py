"""When a proposal is worth verifying: the share of it a sequence tends to get accepted.

Verifying costs one extra row of the target's forward per proposed token. A step with
few sequences is bound by reading the weights, so the rows are nearly free and every
proposal is verified. With many sequences each row costs its share of compute, and a
rejected proposal slows everyone down: there only sequences whose proposals are mostly
accepted (a moving average over their recent verifications, starting at the bar) speculate;
the others verify a short probe every ``probe_interval`` steps, so a sequence that starts
quoting its prompt is noticed.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.scheduler.sequence import SPEC_ACCEPTANCE_START, Sequence


@dataclass(frozen=True)
class SpeculationPolicy:
    small_batch: int = 4  # at most this many running sequences: always verify
    min_acceptance: float = SPEC_ACCEPTANCE_START  # in larger batches, below: held back
    probe_interval: int = 32  # steps held back before trying again
    probe_tokens: int = 2  # proposals verified by such a try
    smoothing: float = 0.3  # weight of the newest verification in the moving average

    def how_many(self, seq: Sequence, num_running: int) -> int:
        """How many of its proposals ``seq`` verifies this step (0: none)."""
        proposed = len(seq.spec_token_ids)
        if num_running <= self.small_batch:
            return proposed
        if seq.spec_acceptance >= self.min_acceptance:
            return proposed
        seq.spec_steps_held += 1
        if seq.spec_steps_held < self.probe_interval:
            return 0
        seq.spec_steps_held = 0
        return min(proposed, self.probe_tokens)

    def record(self, seq: Sequence, num_proposed: int, num_accepted: int) -> None:
        rate = num_accepted / num_proposed
        seq.spec_acceptance += self.smoothing * (rate - seq.spec_acceptance)
