"""Token-budget scheduler in the style of vLLM v1: no prefill or decode phases.

Each step every sequence catches its computed tokens up with its tokens, within a
per-step budget of ``max_num_batched_tokens``. Running sequences go first (so decodes
keep flowing while long prompts are prefilled in chunks); waiting ones are admitted in
arrival order while budget, ``max_num_seqs`` and free blocks allow. When blocks run out
the newest running sequence is preempted: its blocks are freed and it is recomputed
later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.scheduler.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_new_tokens: int

    @property
    def completes_sequence(self) -> bool:
        """True when this chunk reaches the last token, so the step samples a next token."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    prefills: list[ScheduledChunk] = field(default_factory=list)  # chunks of several tokens
    decodes: list[ScheduledChunk] = field(default_factory=list)  # one token each
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def chunks(self) -> list[ScheduledChunk]:
        return self.prefills + self.decodes

    @property
    def num_batched_tokens(self) -> int:
        return sum(chunk.num_new_tokens for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes


@dataclass
class PrefixCacheCounters:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which found in the cache
    preemptions: int = 0


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.counters = PrefixCacheCounters()

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A sequence forked from a running one: its blocks are already in place."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted:
            self._admit_waiting(out, budget)
        out.block_copies = self.kv.take_pending_copies()
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._allocate_or_preempt(seq, num_new, out):
                break
            _place(out, ScheduledChunk(seq, num_new))
            budget -= num_new
            index += 1
        return budget

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        while not self.kv.allocate_slots(seq.seq_id, seq.num_computed_tokens, num_new):
            victim = self.running.pop()  # the newest
            self.preempt(victim)
            out.preempted.append(victim)
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

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.kv.find_cached_prefix(seq.token_ids)
            num_cached = len(hits) * self.kv.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(seq.seq_id, num_cached, num_new, hits):
                break
            self.waiting.popleft()
            self._start(seq, num_cached)
            _place(out, ScheduledChunk(seq, num_new))
            budget -= num_new

    def _start(self, seq: Sequence, num_cached: int) -> None:
        self.counters.queries += seq.num_tokens
        self.counters.hits += num_cached
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_cached
        seq.num_computed_tokens = num_cached
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence wherever it is and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)


def _place(out: SchedulerOutput, chunk: ScheduledChunk) -> None:
    (out.decodes if chunk.num_new_tokens == 1 else out.prefills).append(chunk)
