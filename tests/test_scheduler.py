"""The token-budget scheduler and the step protocol, driven by hand without a model."""

from __future__ import annotations

import pytest

from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.outputs import ModelRunnerOutput
from octavo.sampling_params import SamplingParams
from octavo.scheduler import scheduler as scheduler_module
from octavo.scheduler.output import SchedulerOutput
from octavo.scheduler.scheduler import Scheduler
from octavo.scheduler.sequence import Sequence, SequenceStatus
from octavo.scheduler.stop_checker import StopLimits

BLOCK = 4
EOS = 2


def make_scheduler(num_blocks=64, max_num_seqs=8, budget=16, **options) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK)
    return Scheduler(kv, max_num_seqs, budget, StopLimits(frozenset({EOS}), 64), **options)


def make_seq(seq_id: int, prompt_len: int, **params) -> Sequence:
    tokens = [seq_id * 1000 + i for i in range(prompt_len)]
    return Sequence(seq_id, f"r{seq_id}", 0, tokens, prompt_len, SamplingParams(**params))


def runner_output(out: SchedulerOutput, token: int = 7) -> ModelRunnerOutput:
    """What a runner would return: ``token`` for every sampling sequence and its forks."""
    ids = [i for s in out.scheduled if s.sample for i in [s.seq_id, *s.fork_seq_ids]]
    return ModelRunnerOutput(ids, [token] * len(ids), [None] * len(ids))


def finish_step(scheduler: Scheduler, out: SchedulerOutput, token: int = 7) -> list:
    """The engine's part of a step without a model: feed a hand-made runner output back."""
    return scheduler.update_from_output(out, runner_output(out, token), now=0.0)


def shares(out: SchedulerOutput, part: str = "scheduled") -> list[tuple[int, int]]:
    return [(s.seq_id, s.num_new_tokens) for s in getattr(out, part)]


def test_long_prompt_is_chunked_and_decodes_share_the_step():
    scheduler = make_scheduler(budget=16)
    short, long = make_seq(1, 5), make_seq(2, 40)
    scheduler.add(short)
    scheduler.add(long)
    first = scheduler.schedule()
    assert shares(first, "prefills") == [(1, 5), (2, 11)]
    finish_step(scheduler, first)
    second = scheduler.schedule()
    assert shares(second, "decodes") == [(1, 1)]
    assert shares(second, "prefills") == [(2, 15)]
    assert second.num_batched_tokens <= 16


def test_without_chunked_prefill_a_prompt_waits_for_room_for_all_of_it():
    scheduler = make_scheduler(budget=16, chunked_prefill=False)
    running, whole = make_seq(1, 5), make_seq(2, 16)
    scheduler.add(running)
    finish_step(scheduler, scheduler.schedule())  # `running` now decodes: 1 of the 16 tokens
    scheduler.add(whole)
    out = scheduler.schedule()
    assert shares(out) == [(1, 1)]  # 15 tokens left: no partial chunk of the prompt
    scheduler.finish(running)
    assert shares(scheduler.schedule(), "prefills") == [(2, 16)]


def test_max_num_seqs_caps_the_running_set_and_admission_is_fcfs():
    scheduler = make_scheduler(max_num_seqs=2, budget=100)
    seqs = [make_seq(i, 3) for i in range(1, 4)]
    for seq in seqs:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert [s.seq_id for s in out.scheduled] == [1, 2]
    assert list(scheduler.waiting) == seqs[2:]


def test_preemption_takes_the_newest_and_requeues_it_first():
    scheduler = make_scheduler(num_blocks=5, budget=100)  # 4 usable blocks of 4 tokens
    old, new = make_seq(1, 8), make_seq(2, 8)
    scheduler.add(old)
    scheduler.add(new)
    finish_step(scheduler, scheduler.schedule())  # both prefilled: 4 blocks used, 9 tokens each
    out = scheduler.schedule()  # each needs a third block: only one can run
    assert out.preempted_seq_ids == [new.seq_id]
    assert [s.seq_id for s in out.scheduled] == [old.seq_id]
    assert scheduler.waiting[0] is new and new.num_computed_tokens == 0
    assert scheduler.counters.preemptions == 1


def test_finish_frees_blocks_wherever_the_sequence_is():
    scheduler = make_scheduler()
    running, waiting = make_seq(1, 6), make_seq(2, 6)
    scheduler.add(running)
    scheduler.schedule()
    scheduler.add(waiting)
    scheduler.finish(running)
    scheduler.finish(waiting)
    pool = scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_usable_blocks and scheduler.num_unfinished == 0


def test_the_output_is_plain_data_the_runner_can_use_alone():
    scheduler = make_scheduler(budget=6)
    seq = make_seq(1, 9, seed=3)
    scheduler.add(seq)
    first = scheduler.schedule()
    (data,) = first.new_sequences
    assert (data.seq_id, data.prompt_token_ids, data.output_token_ids) == (1, seq.token_ids, [])
    assert data.seed == 3 and data.params is seq.params
    (chunk,) = first.prefills
    assert chunk.token_ids == seq.token_ids[:6] and chunk.num_computed_tokens == 0
    assert chunk.block_ids == scheduler.kv.block_ids(1) and len(chunk.block_ids) == 2
    assert not chunk.sample  # 6 of 9 prompt tokens: nothing to sample yet
    assert finish_step(scheduler, first) == [] and seq.num_computed_tokens == 6
    second = scheduler.schedule()
    assert second.new_sequences == []  # announced once
    (chunk,) = second.prefills
    assert chunk.token_ids == seq.token_ids[6:]
    assert (chunk.num_computed_tokens, chunk.sample) == (6, True)


def test_update_from_output_advances_appends_and_finishes():
    scheduler = make_scheduler()
    seq = make_seq(1, 5, max_tokens=2)
    scheduler.add(seq)
    (update,) = finish_step(scheduler, scheduler.schedule(), token=11)
    assert update.seq is seq and update.token_id == 11
    assert seq.token_ids[-1] == 11 and seq.num_computed_tokens == 5
    assert seq.first_scheduled_time == 0.0
    (update,) = finish_step(scheduler, scheduler.schedule(), token=12)
    assert seq.finish_reason == "length" and seq.status is SequenceStatus.FINISHED
    assert scheduler.num_unfinished == 0
    assert scheduler.schedule().finished_seq_ids == [seq.seq_id]  # the runner forgets it


def test_eos_from_the_runner_finishes_the_sequence_and_frees_its_blocks():
    scheduler = make_scheduler()
    seq = make_seq(1, 5, max_tokens=10)
    scheduler.add(seq)
    finish_step(scheduler, scheduler.schedule(), token=EOS)
    assert (seq.finish_reason, seq.is_finished) == ("stop", True)
    pool = scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_n_completions_fork_once_the_prompt_is_computed():
    scheduler = make_scheduler()
    parent = make_seq(scheduler.next_seq_id(), 6, n=3, seed=9)
    scheduler.add(parent)
    out = scheduler.schedule()
    (chunk,) = out.prefills
    assert len(chunk.fork_seq_ids) == 2
    children = [d for d in out.new_sequences if d.seq_id in chunk.fork_seq_ids]
    assert [d.prompt_token_ids for d in children] == [parent.token_ids] * 2
    assert len({d.seed for d in out.new_sequences}) == 3  # each completion its own stream
    updates = finish_step(scheduler, out)
    assert [u.seq.index for u in updates] == [0, 1, 2]
    tables = {tuple(scheduler.kv.block_ids(u.seq.seq_id)) for u in updates}
    assert len(tables) == 1  # the prompt's blocks are shared
    assert all(u.seq.num_computed_tokens == 6 and u.seq.num_tokens == 7 for u in updates)


def test_a_finished_parent_takes_its_planned_forks_along():
    scheduler = make_scheduler()
    parent = make_seq(scheduler.next_seq_id(), 6, n=3)
    scheduler.add(parent)
    out = scheduler.schedule()
    forks = out.prefills[0].fork_seq_ids
    scheduler.finish(parent)  # e.g. its request failed in this step
    assert scheduler.schedule().finished_seq_ids == [parent.seq_id, *forks]


def test_forks_count_against_max_num_seqs_from_admission():
    scheduler = make_scheduler(max_num_seqs=4, budget=100)
    single, triple, double = (make_seq(scheduler.next_seq_id(), 5, n=n) for n in (1, 3, 2))
    for seq in (single, triple, double):
        scheduler.add(seq)
    out = scheduler.schedule()
    assert [s.seq_id for s in out.scheduled] == [single.seq_id, triple.seq_id]
    assert list(scheduler.waiting) == [double]  # 1 + 3 seats taken: its 2 do not fit
    finish_step(scheduler, out)
    assert len(scheduler.running) == 4
    finish_step(scheduler, scheduler.schedule())
    assert list(scheduler.waiting) == [double]
    scheduler.finish(single)  # one seat free: still not enough for two completions
    finish_step(scheduler, scheduler.schedule())
    assert list(scheduler.waiting) == [double]
    scheduler.finish(triple)  # the parent ends; its forks still run
    out = scheduler.schedule()
    assert double.seq_id in [s.seq_id for s in out.scheduled]
    finish_step(scheduler, out)
    assert len(scheduler.running) == 4  # two forks of `triple`, `double` and its fork


def test_a_request_whose_n_exceeds_max_num_seqs_is_refused_by_name():
    scheduler = make_scheduler(max_num_seqs=4)
    scheduler.check_fits(SamplingParams(n=4))
    with pytest.raises(ValueError, match=r"n=5 .* at most 4 sequences \(--max-num-seqs 4\)"):
        scheduler.check_fits(SamplingParams(n=5))


def test_prompt_scoring_rows_per_step_are_bounded(monkeypatch):
    monkeypatch.setattr(scheduler_module, "PROMPT_SCORING_ROWS_PER_STEP", 8)
    scheduler = make_scheduler(num_blocks=64, budget=64)
    ids = [scheduler.next_seq_id() for _ in range(3)]
    scored = [make_seq(ids[i], 20, prompt_logprobs=1) for i in range(2)]
    plain = make_seq(ids[2], 30)
    for seq in (*scored, plain):
        scheduler.add(seq)
    out = scheduler.schedule()
    assert shares(out, "prefills") == [(ids[0], 8)]  # the rest wait their turn (FCFS)
    finish_step(scheduler, out)
    scheduler.finish(scored[0])
    out = scheduler.schedule()  # a prompt that is not scored takes the whole budget
    assert shares(out, "prefills") == [(ids[1], 8), (ids[2], 30)]
