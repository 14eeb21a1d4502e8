"""Token-budget scheduler in the style of vLLM v1: no prefill or decode phases.

Each step every sequence catches its computed tokens up with its tokens, within a
per-step budget of ``max_num_batched_tokens``. Running sequences go first (so decodes
keep flowing while long prompts are prefilled in chunks); waiting ones are admitted in
arrival order while budget, ``max_num_seqs`` and free blocks allow. When blocks run out
the newest running sequence is preempted: its blocks are freed and it is recomputed
later.

The step protocol: ``schedule()`` returns a ``SchedulerOutput`` of plain data; the
executor runs it and returns a ``ModelRunnerOutput`` (one sampled token per sequence);
``update_from_output()`` advances the sequences, registers their full blocks for prefix
caching, forks ``n > 1`` requests once their prompt is computed, appends the tokens and
finishes the sequences that hit EOS, a stop token id or their length limit.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.outputs import ModelRunnerOutput
from octavo.sampling.logprobs import TokenLogprobs
from octavo.scheduler.output import NewSequenceData, ScheduledSequence, SchedulerOutput
from octavo.scheduler.sequence import Sequence, SequenceStatus, sequence_seed
from octavo.scheduler.stop_checker import StopLimits, check_stop


@dataclass
class PrefixCacheCounters:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which found in the cache
    preemptions: int = 0


@dataclass
class SequenceUpdate:
    """One sequence's new token after a step (the sequence may have finished with it)."""

    seq: Sequence
    token_id: int
    logprobs: TokenLogprobs | None


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        limits: StopLimits | None = None,
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.limits = limits or StopLimits(frozenset(), 1 << 62)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.seqs: dict[int, Sequence] = {}  # every unfinished sequence by id
        self.counters = PrefixCacheCounters()
        self._seq_ids = itertools.count()
        self._finished_ids: list[int] = []  # to tell the runner on the next step

    def next_seq_id(self) -> int:
        return next(self._seq_ids)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    # ----- schedule ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        plan: list[tuple[Sequence, int]] = []
        budget = self._schedule_running(out, plan, self.max_num_batched_tokens)
        if not out.preempted_seq_ids:
            self._admit_waiting(plan, budget)
        for seq, num_new in plan:
            self._place(out, seq, num_new)
        out.block_copies = self.kv.take_pending_copies()
        out.finished_seq_ids, self._finished_ids = self._finished_ids, []
        return out

    def _schedule_running(
        self, out: SchedulerOutput, plan: list[tuple[Sequence, int]], budget: int
    ) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._allocate_or_preempt(seq, num_new, out):
                break
            plan.append((seq, num_new))
            budget -= num_new
            index += 1
        return budget

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        while not self.kv.allocate_slots(seq.seq_id, seq.num_computed_tokens, num_new):
            victim = self.running.pop()  # the newest
            self.preempt(victim)
            out.preempted_seq_ids.append(victim.seq_id)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        self.kv.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.counters.preemptions += 1

    def _admit_waiting(self, plan: list[tuple[Sequence, int]], budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            scored = seq.params.prompt_logprobs is not None  # every prompt token is computed
            hits = [] if scored else self.kv.find_cached_prefix(seq.token_ids)
            num_cached = len(hits) * self.kv.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(seq.seq_id, num_cached, num_new, hits):
                break
            self.waiting.popleft()
            self._start(seq, num_cached)
            plan.append((seq, num_new))
            budget -= num_new

    def _start(self, seq: Sequence, num_cached: int) -> None:
        self.counters.queries += seq.num_tokens
        self.counters.hits += num_cached
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_cached
        seq.num_computed_tokens = num_cached
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _place(self, out: SchedulerOutput, seq: Sequence, num_new: int) -> None:
        start = seq.num_computed_tokens
        scheduled = ScheduledSequence(
            seq_id=seq.seq_id,
            token_ids=seq.token_ids[start : start + num_new],
            num_computed_tokens=start,
            block_ids=self.kv.block_ids(seq.seq_id),
            sample=start + num_new == seq.num_tokens,
        )
        if not seq.announced:
            seq.announced = True
            out.new_sequences.append(_new_sequence_data(seq, seq.seq_id, seq.index))
        if scheduled.sample and seq.awaits_fork:
            self._plan_forks(out, seq, scheduled)
        (out.decodes if num_new == 1 else out.prefills).append(scheduled)

    def _plan_forks(
        self, out: SchedulerOutput, seq: Sequence, scheduled: ScheduledSequence
    ) -> None:
        """The first completion's prompt is done this step: its siblings sample from it."""
        seq.fork_seq_ids = [self.next_seq_id() for _ in range(seq.params.n - 1)]
        scheduled.fork_seq_ids = list(seq.fork_seq_ids)
        for index, child_id in enumerate(seq.fork_seq_ids, start=1):
            out.new_sequences.append(_new_sequence_data(seq, child_id, index))

    # ----- update from the runner's output -------------------------------------------------
    def update_from_output(
        self, out: SchedulerOutput, result: ModelRunnerOutput, now: float
    ) -> list[SequenceUpdate]:
        """Advance the scheduled sequences and append the runner's tokens (see the module doc)."""
        for scheduled in out.scheduled:
            seq = self.seqs[scheduled.seq_id]
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            seq.num_computed_tokens += scheduled.num_new_tokens
            self.kv.cache_full_blocks(seq.seq_id, seq.token_ids, seq.num_computed_tokens)
            if scheduled.fork_seq_ids:
                self._fork(seq)
        for seq_id, (first, entries) in result.prompt_logprobs.items():
            seq = self.seqs[seq_id]  # entries recomputed after a preemption are dropped
            seq.prompt_logprobs.extend(entries[max(0, len(seq.prompt_logprobs) - first) :])
        updates = []
        for seq_id, token, logprob in zip(
            result.seq_ids, result.sampled_token_ids, result.logprobs, strict=True
        ):
            seq = self.seqs[seq_id]
            seq.token_ids.append(token)
            check_stop(seq, token, self.limits)
            if seq.finish_reason is not None:
                self.finish(seq)
            updates.append(SequenceUpdate(seq, token, logprob))
        return updates

    def _fork(self, parent: Sequence) -> None:
        for index, child_id in enumerate(parent.fork_seq_ids, start=1):
            child = parent.fork(child_id, index)
            self.kv.fork(parent.seq_id, child_id)
            child.status = SequenceStatus.RUNNING
            self.seqs[child_id] = child
            self.running.append(child)
        parent.fork_seq_ids = []
        parent.forked = True

    # ----- finishing ----------------------------------------------------------------------
    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence wherever it is and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        if self.seqs.pop(seq.seq_id, None) is not None:
            self._finished_ids += [seq.seq_id, *seq.fork_seq_ids]
            seq.fork_seq_ids = []

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)


def _new_sequence_data(seq: Sequence, seq_id: int, index: int) -> NewSequenceData:
    return NewSequenceData(
        seq_id=seq_id,
        prompt_token_ids=seq.prompt_token_ids,
        output_token_ids=seq.output_token_ids,
        params=seq.params,
        seed=sequence_seed(seq.params.seed, index),
    )
