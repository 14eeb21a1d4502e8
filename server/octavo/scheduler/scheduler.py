"""Token-budget scheduler in the style of vLLM v1: no prefill or decode phases.

Each step every sequence catches its computed tokens up with its tokens, within a
per-step budget of ``max_num_batched_tokens``. Running sequences go first (so decodes
keep flowing while long prompts are prefilled in chunks); waiting ones are admitted in
arrival order while budget, ``max_num_seqs`` and free blocks allow (a request's ``n``
completions count against ``max_num_seqs`` from its admission, before they fork). When
blocks run out the newest running sequence is preempted: its blocks are freed and it is
recomputed later. A prompt whose logprobs are scored is computed at most
``PROMPT_SCORING_ROWS_PER_STEP`` tokens a step (each is a vocabulary-wide logits row).

The step protocol: ``schedule()`` returns a ``SchedulerOutput`` of plain data; the
executor runs it and returns a ``ModelRunnerOutput`` (one sampled token per sequence);
``update_from_output()`` advances the sequences, registers their full blocks for prefix
caching, forks ``n > 1`` requests once their prompt is computed, appends the tokens and
finishes the sequences that hit EOS, a stop token id or their length limit.

Speculative decoding: a decoding sequence that holds proposed tokens (``spec_token_ids``,
from the runner's previous step) schedules its last token followed by as many proposals
as its budget, length limit and ``max_tokens`` allow. The runner returns the tokens it
kept (one or more per sequence, in order); only the kept ones count as computed, so the
KV slots of rejected proposals are written over by the next step. With a draft model,
slots for ``num_lookahead_tokens`` more positions are kept ready for its proposals.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from octavo.kv_cache.group_coordinator import KVCacheCoordinator
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.outputs import ModelRunnerOutput
from octavo.sampling.token_logprobs import TokenLogprobs
from octavo.sampling_params import SamplingParams
from octavo.scheduler.encoder_budget import EncoderBudget, encoder_budget_from_env
from octavo.scheduler.output import (
    IN_FLIGHT_TOKEN,
    NewSequenceData,
    ScheduledSequence,
    SchedulerOutput,
)
from octavo.scheduler.sequence import Sequence, SequenceStatus, sequence_seed
from octavo.scheduler.spec_decode_counters import SpecDecodeCounters
from octavo.scheduler.speculation_policy import SpeculationPolicy
from octavo.scheduler.stop_checker import StopLimits, check_stop
from octavo.scheduler.whole_images import check_images_fit, whole_image_chunk

# Prompt positions scored (``prompt_logprobs``) in one step at most: each is a full
# [vocab] logits row plus its log-softmax, so an 8k-token echo+logprobs prompt is scored
# in chunks that keep a step's memory and time (and other requests' decodes) bounded.
PROMPT_SCORING_ROWS_PER_STEP = 256


@dataclass
class PrefixCacheCounters:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which found in the cache
    preemptions: int = 0


@dataclass(slots=True)
class SequenceUpdate:
    """One sequence's new token after a step (the sequence may have finished with it)."""

    seq: Sequence
    token_id: int
    logprobs: TokenLogprobs | None
    num_tokens: int  # the sequence's length with this token (later ones may follow it)


@dataclass(slots=True)
class PlannedSequence:
    seq: Sequence
    num_new: int  # known tokens to compute
    spec: list[int]  # proposals verified after them

    @property
    def num_slots(self) -> int:
        return self.num_new + len(self.spec)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager | KVCacheCoordinator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        limits: StopLimits | None = None,
        num_lookahead_tokens: int = 0,
        chunked_prefill: bool = True,
    ) -> None:
        self.kv = kv
        self.chunked_prefill = chunked_prefill  # False: a prompt is computed whole in one step
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.limits = limits or StopLimits(frozenset(), 1 << 62)
        self.num_lookahead_tokens = num_lookahead_tokens  # slots a draft model writes ahead
        self.spec_counters = SpecDecodeCounters()
        self.speculation = SpeculationPolicy()
        self.max_loras = 1  # distinct LoRA adapters in one step
        self.whole_images = False  # never split an image over two chunks (Gemma 3)
        self.whole_prompts = False  # an encoder's prompt in one step, or not yet (BERT)
        self.encoder = EncoderBudget(encoder_budget_from_env(max_num_batched_tokens))
        self.lora_unloads: set[int] = set()  # removed adapters the workers may drop once unused
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.seqs: dict[int, Sequence] = {}  # every unfinished sequence by id
        self.counters = PrefixCacheCounters()
        self._seq_ids = itertools.count()
        self._finished_ids: list[int] = []  # to tell the runner on the next step
        self._scoring_rows_left = PROMPT_SCORING_ROWS_PER_STEP
        # Async scheduling: each step is planned while the previous one still runs, so a
        # decode's input may be the token that step is sampling (IN_FLIGHT_TOKEN).
        self.overlapped = False
        self.kv_groups = isinstance(kv, KVCacheCoordinator)  # a block table per KV group
        # P/D disaggregation (``kv_transfer``; None without --kv-transfer-config): on finish,
        # ``holds_blocks`` may keep a sequence's blocks for a remote decode (it frees them
        # later); a sequence with ``remote_kv`` is admitted with blocks for its whole prompt,
        # waits in ``waiting_for_remote`` and is given to ``on_remote_admit`` to fill them.
        self.holds_blocks: Callable[[Sequence], bool] | None = None
        self.on_remote_admit: Callable[[Sequence], None] | None = None
        self.waiting_for_remote: dict[int, Sequence] = {}

    def next_seq_id(self) -> int:
        return next(self._seq_ids)

    def check_fits(self, params: SamplingParams) -> None:
        """``ValueError`` for a request that could never be admitted: its ``n`` completions
        run at once, so ``n`` may not exceed ``max_num_seqs``."""
        if params.n > self.max_num_seqs:
            raise ValueError(
                f"n={params.n} completions must run at once, but the engine runs at most "
                f"{self.max_num_seqs} sequences (--max-num-seqs {self.max_num_seqs}); "
                f"ask for n <= {self.max_num_seqs}"
            )

    def check_images(self, images: list) -> None:
        """``ValueError`` for an image a step could never hold (when images stay whole)."""
        if self.whole_images:
            check_images_fit(images, self.max_num_batched_tokens)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    # ----- schedule ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        plan: list[PlannedSequence] = []
        self._scoring_rows_left = PROMPT_SCORING_ROWS_PER_STEP
        self.encoder.start_step()
        budget = self._schedule_running(out, plan, self.max_num_batched_tokens)
        if not out.preempted_seq_ids:
            self._admit_waiting(plan, budget)
        for planned in plan:
            self._place(out, planned)
        out.block_copies = self.kv.take_pending_copies()
        out.tier_copies = self.kv.pool.take_tier_copies()
        out.state_copies = self.kv.take_state_copies()
        out.finished_seq_ids, self._finished_ids = self._finished_ids, []
        out.unloaded_lora_ids = self._unloads_ready()
        out.computed_at_schedule = self.overlapped
        return out

    def _unloads_ready(self) -> list[int]:
        """Removed adapters no unfinished sequence uses any more (told to the workers once)."""
        if not self.lora_unloads:
            return []
        ready = self.lora_unloads - {seq.lora_id for seq in self.seqs.values()}
        self.lora_unloads -= ready
        return sorted(ready)

    def _schedule_running(
        self, out: SchedulerOutput, plan: list[PlannedSequence], budget: int
    ) -> int:
        index, adapters, running = 0, set(), self.running
        while index < len(running) and budget > 0:
            seq = running[index]
            index += 1
            if seq.lora_request is not None and not self._adapter_fits(seq, adapters):
                continue
            if seq.num_in_flight and not self._may_plan_ahead(seq):
                continue
            num_new = self._chunk(seq, seq.num_computed_tokens, budget)
            if num_new == 0:  # a prompt to score, and this step's scoring rows are spent
                continue
            spec = self._proposals_that_fit(seq, budget) if seq.spec_token_ids else []
            planned = PlannedSequence(seq, num_new, spec)
            if not self._allocate_or_preempt(planned, out):
                break
            self._plan(plan, planned)
            budget -= planned.num_slots
        return budget

    def _may_plan_ahead(self, seq: Sequence) -> bool:
        """May a sequence whose last token is still in flight decode it next step? Not
        when that token is its last (``max_tokens``, the context length), nor while its
        forks are waiting to be made from it (they share what it has computed so far)."""
        known = seq.num_tokens + seq.num_in_flight
        if seq.fork_seq_ids or known >= self.limits.max_model_len:
            return False
        max_tokens = seq.params.max_tokens
        return max_tokens is None or known - seq.num_prompt_tokens < max_tokens

    def _chunk(self, seq: Sequence, num_computed: int, budget: int) -> int:
        """Tokens of ``seq`` to compute this step: within the budget, and a prompt whose
        logprobs are asked for within the step's ``PROMPT_SCORING_ROWS_PER_STEP``; with
        ``whole_images``, ending outside every image (``whole_images.py``); stopping
        before an image the step's encoder budget cannot pay for (``encoder_budget.py``)."""
        most = min(seq.num_tokens + seq.num_in_flight - num_computed, budget)
        num_new = most
        scored = seq.params.prompt_logprobs is not None and num_computed < seq.num_prompt_tokens
        if scored:
            num_new = min(num_new, self._scoring_rows_left)
        if self.whole_images and seq.images:
            num_new = whole_image_chunk(seq.images, num_computed, num_new, most)
        if self.whole_prompts and num_new < seq.num_prompt_tokens - num_computed:
            num_new = 0  # the prompt waits for a step with room for all of it
        if seq.images and num_computed < seq.images[-1].end:
            end = self.encoder.chunk_end(seq.images, num_computed, num_computed + num_new)
            num_new = end - num_computed
        if scored:
            self._scoring_rows_left = max(0, self._scoring_rows_left - num_new)
        return num_new

    def _plan(self, plan: list[PlannedSequence], planned: PlannedSequence) -> None:
        """Take ``planned`` into the step (its slots are allocated) and charge the images
        its chunk encodes to the step's encoder budget."""
        plan.append(planned)
        seq = planned.seq
        if seq.images:
            start = seq.num_computed_tokens
            self.encoder.charge(seq.seq_id, seq.images, start, start + planned.num_new)

    def _adapter_fits(self, seq: Sequence, adapters: set[int]) -> bool:
        """Room for ``seq``'s LoRA adapter in a step that already uses ``adapters``?"""
        if seq.lora_request is None or seq.lora_id in adapters:
            return True
        if len(adapters) >= self.max_loras:
            return False
        adapters.add(seq.lora_id)
        return True

    def _proposals_that_fit(self, seq: Sequence, budget: int) -> list[int]:
        """The proposals a decoding sequence verifies this step: within the token budget,
        and no more than could be kept before ``max_tokens`` or the context length."""
        if not seq.spec_token_ids or seq.num_tokens - seq.num_computed_tokens != 1:
            return []
        room = min(budget, self.limits.max_model_len - seq.num_tokens) - 1
        room = min(room, self.speculation.how_many(seq, len(self.running)))
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
        return seq.spec_token_ids[: max(0, room)]

    def _lookahead(self, seq: Sequence, num_computed: int, planned: PlannedSequence) -> int:
        """Slots kept past this step's tokens for a draft model's next proposals."""
        if not self.num_lookahead_tokens:
            return 0
        if num_computed + planned.num_new < seq.num_tokens:  # a prompt chunk: no sampling yet
            return 0
        end = num_computed + planned.num_slots
        return max(0, min(self.num_lookahead_tokens, self.limits.max_model_len - end))

    def _allocate_or_preempt(self, planned: PlannedSequence, out: SchedulerOutput) -> bool:
        seq, num_computed = planned.seq, planned.seq.num_computed_tokens
        num_slots = planned.num_new + len(planned.spec)
        if self.num_lookahead_tokens:
            num_slots += self._lookahead(seq, num_computed, planned)
        while not self.kv.allocate_slots(seq.seq_id, num_computed, num_slots):
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
        seq.spec_token_ids = []
        self.encoder.release_all(seq.seq_id, seq.images)  # recomputed: charged again
        self.waiting.appendleft(seq)
        self.counters.preemptions += 1

    def _admit_waiting(self, plan: list[PlannedSequence], budget: int) -> None:
        if not self.waiting:
            return  # most decode steps
        adapters = {p.seq.lora_id for p in plan if p.seq.lora_id is not None}
        seats_taken = sum(seats(seq) for seq in self.running) + len(self.waiting_for_remote)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if seats_taken + seats(seq) > self.max_num_seqs:
                break  # first come, first served: it waits until its completions fit
            if seq.num_in_flight:  # preempted while a token was in flight: it comes first
                break
            if not self._adapter_fits(seq, adapters):
                break
            if seq.remote_kv is not None:
                if not self._admit_remote(seq):
                    break
                seats_taken += 1
                continue
            scored = seq.params.computes_whole_prompt  # every prompt token is computed
            hits = [] if scored else self.kv.find_cached_prefix(seq.token_ids, seq.hash_chain)
            num_cached = len(hits) * self.kv.block_size
            if not (self.chunked_prefill or scored) and seq.num_tokens - num_cached > budget:
                break  # it waits for a step with room for its whole prompt (scored: chunked)
            num_new = self._chunk(seq, num_cached, budget)
            if num_new == 0:
                break
            planned = PlannedSequence(seq, num_new, [])
            num_slots = planned.num_new + self._lookahead(seq, num_cached, planned)
            if not self.kv.allocate_slots(seq.seq_id, num_cached, num_slots, hits):
                break
            self.waiting.popleft()
            self._start(seq, num_cached)
            self._plan(plan, planned)
            budget -= planned.num_new
            seats_taken += seats(seq)

    def _admit_remote(self, seq: Sequence) -> bool:
        """Admit a sequence whose prompt's KV a remote prefill holds: blocks for its whole
        prompt (local prefix-cache hits taken as usual), then it waits for the transfer."""
        hits = self.kv.find_cached_prefix(seq.token_ids, seq.hash_chain)
        num_cached = len(hits) * self.kv.block_size
        if not self.kv.allocate_slots(seq.seq_id, num_cached, seq.num_tokens - num_cached, hits):
            return False
        self.waiting.popleft()
        self.counters.queries += seq.num_tokens
        self.counters.hits += num_cached
        seq.num_cached_tokens = seq.num_computed_tokens = num_cached
        seq.status = SequenceStatus.WAITING_FOR_REMOTE_KV
        self.waiting_for_remote[seq.seq_id] = seq
        assert self.on_remote_admit is not None, "a remote prefill needs the KV connector"
        self.on_remote_admit(seq)
        return True

    def start_after_remote(self, seq: Sequence, num_computed: int) -> None:
        """The transfer is over (or failed and the prompt is recomputed from
        ``num_computed``): the sequence runs from its next step on."""
        del self.waiting_for_remote[seq.seq_id]
        seq.remote_kv = None
        seq.num_computed_tokens = num_computed
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self._cache_blocks(seq)  # imported full blocks: a preempted seq finds them again

    def _start(self, seq: Sequence, num_cached: int) -> None:
        self.counters.queries += seq.num_tokens
        self.counters.hits += num_cached
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_cached
        seq.num_computed_tokens = num_cached
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _place(self, out: SchedulerOutput, planned: PlannedSequence) -> None:
        seq, num_new, start = planned.seq, planned.num_new, planned.seq.num_computed_tokens
        token_ids = seq.token_ids[start : start + num_new]
        if len(token_ids) < num_new:  # the last input is the token in flight
            token_ids.append(IN_FLIGHT_TOKEN)
        scheduled = ScheduledSequence(
            seq_id=seq.seq_id,
            token_ids=token_ids + planned.spec if planned.spec else token_ids,
            num_computed_tokens=start,
            block_ids=self.kv.block_ids(seq.seq_id),
            sample=start + num_new == len(seq.token_ids) + seq.num_in_flight,
            num_spec_tokens=len(planned.spec),
            state_slot=self.kv.state_slot(seq.seq_id),
        )
        if self.kv_groups:
            scheduled.group_block_ids = self.kv.group_block_ids(seq.seq_id)
        if self.overlapped:  # counted now: the next step is planned before this one ends
            seq.num_computed_tokens += num_new
            seq.num_in_flight += scheduled.sample
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
            seq = self.seqs.get(scheduled.seq_id)
            if seq is None:  # finished while its step was in flight (async scheduling)
                continue
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            if out.computed_at_schedule:
                seq.num_in_flight -= scheduled.sample
            else:
                seq.num_computed_tokens += len(scheduled.token_ids) - scheduled.num_spec_tokens
            if seq.images:
                self.encoder.release_passed(seq.seq_id, seq.images, seq.num_computed_tokens)
            if seq.spec_token_ids:
                seq.spec_token_ids = []
            if not scheduled.num_spec_tokens:  # else once the kept proposals are known
                self._cache_blocks(seq)
            if scheduled.fork_seq_ids:
                self._fork(seq)
        for seq_id, (first, entries) in result.prompt_logprobs.items():
            seq = self.seqs[seq_id]  # entries recomputed after a preemption are dropped
            seq.prompt_logprobs.extend(entries[max(0, len(seq.prompt_logprobs) - first) :])
        updates = self._append_tokens(result)
        self._finish_pooled(result)
        self._after_verification(out, result)
        for seq_id, proposal in result.draft_token_ids.items():
            seq = self.seqs.get(seq_id)
            if seq is not None and seq.status is SequenceStatus.RUNNING:
                seq.spec_token_ids = proposal
        return updates

    def _append_tokens(self, result: ModelRunnerOutput) -> list[SequenceUpdate]:
        """Append each kept token in order; a sequence's later tokens follow a kept
        proposal, whose keys/values this step computed. Tokens after a finish are dropped."""
        updates, seen = [], set()
        for seq_id, token, logprob in zip(
            result.seq_ids, result.sampled_token_ids, result.logprobs, strict=True
        ):
            seq = self.seqs.get(seq_id)
            if seq is None:  # finished by an earlier token of this step
                continue
            if seq_id in seen:
                seq.num_computed_tokens += 1
            seen.add(seq_id)
            seq.token_ids.append(token)
            check_stop(seq, token, self.limits)
            if seq.finish_reason is not None:
                self.finish(seq)
            updates.append(SequenceUpdate(seq, token, logprob, seq.num_tokens))
        return updates

    def _finish_pooled(self, result: ModelRunnerOutput) -> None:
        """A pooling sequence ends once its whole prompt was computed and pooled (its
        blocks stay in the prefix cache as any finished prompt's)."""
        for seq_id in result.pooled:
            seq = self.seqs.get(seq_id)
            if seq is not None:
                seq.finish_reason = "stop"
                self.finish(seq)

    def _after_verification(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """Count each verification and register the blocks its kept proposals filled."""
        speculative = [s for s in out.decodes if s.is_speculative]
        if not speculative:
            return
        kept = Counter(result.seq_ids)
        for scheduled in speculative:
            num_accepted = min(kept[scheduled.seq_id] - 1, scheduled.num_spec_tokens)
            self.spec_counters.record(scheduled.num_spec_tokens, max(0, num_accepted))
            seq = self.seqs.get(scheduled.seq_id)
            if seq is not None:
                self.speculation.record(seq, scheduled.num_spec_tokens, max(0, num_accepted))
                self._cache_blocks(seq)

    def _cache_blocks(self, seq: Sequence) -> None:
        """Register its computed full blocks (async scheduling: those of known tokens; none
        once it was preempted while its step was in flight)."""
        if seq.status is not SequenceStatus.RUNNING:
            return
        computed = min(seq.num_computed_tokens, seq.num_tokens)
        self.kv.cache_full_blocks(
            seq.seq_id, seq.token_ids, computed, seq.hash_chain, seq.lora_request
        )

    def _fork(self, parent: Sequence) -> None:
        for index, child_id in enumerate(parent.fork_seq_ids, start=1):
            child = parent.fork(child_id, index)
            self.kv.fork(parent.seq_id, child_id, parent.num_computed_tokens)
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
        self.waiting_for_remote.pop(seq.seq_id, None)
        if self.holds_blocks is None or not self.holds_blocks(seq):
            self.kv.free(seq.seq_id)
        self.encoder.release_all(seq.seq_id, seq.images)
        seq.status = SequenceStatus.FINISHED
        if self.seqs.pop(seq.seq_id, None) is not None:
            self._finished_ids += [seq.seq_id, *seq.fork_seq_ids]
            seq.fork_seq_ids = []

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.waiting_for_remote)


def seats(seq: Sequence) -> int:
    """Places in ``max_num_seqs`` a sequence holds: itself and the completions it will
    fork (``n - 1`` before its prompt is computed), so forks never exceed the limit."""
    if seq.awaits_fork:
        return seq.params.n
    return 1 + len(seq.fork_seq_ids)


def _new_sequence_data(seq: Sequence, seq_id: int, index: int) -> NewSequenceData:
    return NewSequenceData(
        seq_id=seq_id,
        prompt_token_ids=seq.prompt_token_ids,
        output_token_ids=seq.output_token_ids,
        params=seq.params,
        seed=sequence_seed(seq.params.seed, index),
        lora_request=seq.lora_request,
        images=seq.images,
    )
