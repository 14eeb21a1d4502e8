"""How speculation is doing: proposals made and accepted, in vLLM's metric terms."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)
LOG_INTERVAL_SECONDS = 10.0


@dataclass
class SpecDecodeCounters:
    num_drafts: int = 0  # sequence-steps that verified at least one proposed token
    num_draft_tokens: int = 0  # proposed tokens verified
    num_accepted_tokens: int = 0  # of which the target agreed with
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: proposal i accepted

    def record(self, num_proposed: int, num_accepted: int) -> None:
        """One sequence's verification: ``num_accepted`` of ``num_proposed`` tokens kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        missing = num_proposed - len(self.accepted_per_position)
        self.accepted_per_position += [0] * max(0, missing)
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    def copy(self) -> SpecDecodeCounters:
        return self.since(SpecDecodeCounters())

    def since(self, earlier: SpecDecodeCounters) -> SpecDecodeCounters:
        """What happened after ``earlier`` (a copy of these counters, taken then)."""
        positions = [
            now
            - (earlier.accepted_per_position[i] if i < len(earlier.accepted_per_position) else 0)
            for i, now in enumerate(self.accepted_per_position)
        ]
        return SpecDecodeCounters(
            self.num_drafts - earlier.num_drafts,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
            positions,
        )

    def position_rates(self) -> list[float]:
        """How often proposal ``i`` was accepted, per verification."""
        return (
            [count / self.num_drafts for count in self.accepted_per_position]
            if self.num_drafts
            else []
        )

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification: the accepted ones plus the target's own."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass
class SpecDecodeLog:
    """Logs the acceptance since the previous line, at most every ``interval`` seconds."""

    interval: float = LOG_INTERVAL_SECONDS
    last_time: float = field(default_factory=time.monotonic)
    last: SpecDecodeCounters = field(default_factory=SpecDecodeCounters)

    def maybe_log(self, counters: SpecDecodeCounters) -> None:
        now = time.monotonic()
        if now - self.last_time < self.interval or counters.num_drafts == self.last.num_drafts:
            return
        recent = counters.since(self.last)
        rates = " ".join(f"{rate:.2f}" for rate in recent.position_rates())
        logger.info(
            "speculative decoding: acceptance rate %.1f%% (%d of %d proposed tokens), "
            "mean accepted length %.2f, per position %s",
            100 * recent.acceptance_rate,
            recent.num_accepted_tokens,
            recent.num_draft_tokens,
            recent.mean_accepted_length,
            rates,
        )
        self.last_time, self.last = now, counters.copy()
