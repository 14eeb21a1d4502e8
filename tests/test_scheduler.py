"""The token-budget scheduler, driven by hand without a model."""

from __future__ import annotations

from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.sampling_params import SamplingParams
from octavo.scheduler.scheduler import Scheduler, SchedulerOutput
from octavo.scheduler.sequence import Sequence

BLOCK = 4


def make_scheduler(num_blocks=64, max_num_seqs=8, budget=16) -> Scheduler:
    return Scheduler(KVCacheManager(BlockPool(num_blocks), BLOCK), max_num_seqs, budget)


def make_seq(seq_id: int, prompt_len: int) -> Sequence:
    tokens = [seq_id * 1000 + i for i in range(prompt_len)]
    return Sequence(seq_id, f"r{seq_id}", 0, tokens, prompt_len, SamplingParams())


def finish_step(scheduler: Scheduler, out: SchedulerOutput) -> None:
    """What the engine does after a forward pass: advance, and append a token if complete."""
    for chunk in out.chunks:
        completes = chunk.completes_sequence
        chunk.seq.num_computed_tokens += chunk.num_new_tokens
        if completes:
            chunk.seq.token_ids.append(7)


def test_long_prompt_is_chunked_and_decodes_share_the_step():
    scheduler = make_scheduler(budget=16)
    short, long = make_seq(1, 5), make_seq(2, 40)
    scheduler.add(short)
    scheduler.add(long)
    first = scheduler.schedule()
    assert [(c.seq, c.num_new_tokens) for c in first.prefills] == [(short, 5), (long, 11)]
    finish_step(scheduler, first)
    second = scheduler.schedule()
    assert [(c.seq, c.num_new_tokens) for c in second.decodes] == [(short, 1)]
    assert [(c.seq, c.num_new_tokens) for c in second.prefills] == [(long, 15)]
    assert second.num_batched_tokens <= 16


def test_max_num_seqs_caps_the_running_set_and_admission_is_fcfs():
    scheduler = make_scheduler(max_num_seqs=2, budget=100)
    seqs = [make_seq(i, 3) for i in range(1, 4)]
    for seq in seqs:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert [c.seq for c in out.chunks] == seqs[:2]
    assert list(scheduler.waiting) == seqs[2:]


def test_preemption_takes_the_newest_and_requeues_it_first():
    scheduler = make_scheduler(num_blocks=5, budget=100)  # 4 usable blocks of 4 tokens
    old, new = make_seq(1, 8), make_seq(2, 8)
    scheduler.add(old)
    scheduler.add(new)
    finish_step(scheduler, scheduler.schedule())  # both prefilled: 4 blocks used, 9 tokens each
    out = scheduler.schedule()  # each needs a third block: only one can run
    assert out.preempted == [new]
    assert [c.seq for c in out.chunks] == [old]
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
