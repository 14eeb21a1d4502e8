"""Proposals from a small draft model of the target's vocabulary, with its own paged cache.

The draft's KV cache has as many blocks as the target's and is addressed through the
same block tables, so the scheduler's block manager serves both: a block holds the
target's and the draft's keys/values of the same tokens (prefix caching, copy-on-write,
preemption and freeing apply to both at once).

After each step the draft first catches up with every scheduled sequence (the prompt
chunk the target computed, or the tokens a verification kept plus the target's own),
then feeds its own greedy choices back ``k - 1`` times; the slots it writes past the last
kept token are the ones the scheduler keeps ahead (``num_lookahead_tokens``). Draft
keys/values only shape proposals: the target verifies every token, so a stale draft entry
can cost acceptance, never correctness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from octavo.kv_cache.cache_tensors import copy_blocks
from octavo.model_executor.paged_model import PagedModel
from octavo.model_executor.step_inputs import lay_out, step_inputs
from octavo.sampling.sampler import row_argmax
from octavo.scheduler.output import ScheduledSequence, SchedulerOutput


@dataclass
class DraftJob:
    """One sequence's draft work this step."""

    chunk: ScheduledSequence  # the tokens to catch up on (``sample``: then propose)
    num_proposals: int  # how many tokens to propose (0: catch up only)


class DraftModelProposer:
    def __init__(self, paged: PagedModel, num_speculative_tokens: int) -> None:
        self.paged, self.kv_caches, self.block_size = paged, paged.kv_caches, paged.block_size
        self.k = num_speculative_tokens
        self.computed: dict[int, int] = {}  # tokens of each sequence in the draft's cache

    def forget(self, seq_ids: list[int]) -> None:
        """Finished sequences, and preempted ones (their blocks, and the draft's entries in
        them, are gone; they start again from what the scheduler finds cached)."""
        for seq_id in seq_ids:
            self.computed.pop(seq_id, None)

    @torch.inference_mode()
    def propose_step(
        self, step: SchedulerOutput, seq_ids: list[int], history: Callable[[int], list[int]]
    ) -> dict[int, list[int]]:
        copy_blocks(self.kv_caches, step.block_copies)
        jobs = self._jobs(step, set(seq_ids), history)
        if not jobs:
            return {}
        proposing = [job for job in jobs if job.num_proposals > 0]
        choices = self._forward([job.chunk for job in jobs])
        proposals = {
            job.chunk.seq_id: [token] for job, token in zip(proposing, choices, strict=True)
        }
        for depth in range(1, self.k):
            more = [job for job in proposing if job.num_proposals > depth]
            if not more:
                break
            chunks = [self._feed(job.chunk, proposals[job.chunk.seq_id]) for job in more]
            for job, token in zip(more, self._forward(chunks), strict=True):
                proposals[job.chunk.seq_id].append(token)
        return proposals

    def _jobs(
        self, step: SchedulerOutput, wanted: set[int], history: Callable[[int], list[int]]
    ) -> list[DraftJob]:
        jobs = []
        for scheduled in step.scheduled:
            job = self._job(scheduled, scheduled.seq_id in wanted, history)
            for child_id in scheduled.fork_seq_ids:  # they share the prompt just computed
                self.computed[child_id] = self.computed[scheduled.seq_id]
            if job is not None:
                jobs.append(job)
        jobs.sort(key=lambda job: job.chunk.num_new_tokens == 1)  # chunks, then single tokens
        return jobs

    def _job(
        self, scheduled: ScheduledSequence, sampled: bool, history: Callable[[int], list[int]]
    ) -> DraftJob | None:
        seq_id, capacity = scheduled.seq_id, len(scheduled.block_ids) * self.block_size
        start = self.computed.get(seq_id, scheduled.num_computed_tokens)
        if start > scheduled.num_computed_tokens + 1:  # preempted and recomputed
            start = scheduled.num_computed_tokens
        proposes = sampled and not scheduled.fork_seq_ids
        tokens = history(seq_id)
        end = len(tokens) if proposes else scheduled.num_computed_tokens + scheduled.num_new_tokens
        end = min(end, capacity)
        num_proposals = min(self.k, capacity - end + 1) if proposes and end == len(tokens) else 0
        self.computed[seq_id] = end
        if end <= start:
            return None
        chunk = ScheduledSequence(
            seq_id, tokens[start:end], start, scheduled.block_ids, sample=num_proposals > 0
        )
        return DraftJob(chunk, max(0, num_proposals))

    def _feed(self, chunk: ScheduledSequence, proposed: list[int]) -> ScheduledSequence:
        """The draft's latest proposal as the next single-token input."""
        position = chunk.num_computed_tokens + chunk.num_new_tokens + len(proposed) - 1
        return ScheduledSequence(chunk.seq_id, [proposed[-1]], position, chunk.block_ids, True)

    def _forward(self, chunks: list[ScheduledSequence]) -> list[int]:
        """One draft forward over ``chunks``; the greedy next token of each sampling one."""
        num_prefills = sum(1 for chunk in chunks if chunk.num_new_tokens > 1)
        inputs = step_inputs(lay_out(chunks, self.block_size), num_prefills, self.paged.device)
        logits = self.paged.forward(inputs)
        return row_argmax(logits) if len(inputs.sampled) else []
