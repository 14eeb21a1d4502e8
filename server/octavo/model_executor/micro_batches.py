"""Splitting a step into micro-batches so pipeline stages work at the same time.

With ``M`` micro-batches and ``P`` stages, stage ``s`` runs micro-batch ``m`` while stage
``s + 1`` runs ``m - 1``: a step takes ``M + P - 1`` micro-batch times instead of
``M × P``. Octavo splits each step into ``P`` micro-batches of about equal token counts
(whole sequences, prefills before decodes as in the step), which every rank computes
the same way from the same ``SchedulerOutput``.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.scheduler.output import ScheduledSequence


@dataclass
class MicroBatch:
    scheduled: list[ScheduledSequence]
    num_prefills: int


def split_micro_batches(
    scheduled: list[ScheduledSequence], num_prefills: int, count: int
) -> list[MicroBatch]:
    """Up to ``count`` contiguous, non-empty slices of ``scheduled`` with balanced tokens."""
    total = sum(seq.num_new_tokens for seq in scheduled)
    batches: list[MicroBatch] = []
    start, seen = 0, 0
    for index, seq in enumerate(scheduled):
        seen += seq.num_new_tokens
        remaining_seqs = len(scheduled) - index - 1
        cut = seen * count >= total * (len(batches) + 1)
        if (cut and remaining_seqs and len(batches) < count - 1) or not remaining_seqs:
            chunk = scheduled[start : index + 1]
            prefills = max(0, min(num_prefills - start, len(chunk)))
            batches.append(MicroBatch(chunk, prefills))
            start = index + 1
    return batches
