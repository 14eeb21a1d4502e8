"""What the model runner asks of a proposer after each step, and which one a config makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from octavo.scheduler.output import SchedulerOutput


class Proposer(Protocol):
    def propose_step(
        self, step: SchedulerOutput, seq_ids: list[int], history: Callable[[int], list[int]]
    ) -> dict[int, list[int]]:
        """Proposed next tokens for ``seq_ids`` (sequences that just got tokens, ending
        with those), by sequence; sequences with nothing to propose are left out.
        ``history(seq_id)`` is a sequence's prompt and generated tokens."""
        ...

    def forget(self, seq_ids: list[int]) -> None:
        """Drop what is kept about finished or preempted sequences."""
        ...
