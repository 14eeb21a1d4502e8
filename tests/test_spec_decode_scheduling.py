"""The scheduler's side of speculative decoding, driven by hand without a model: which
proposals a step verifies, how kept tokens advance a sequence, slots kept ahead for a
draft model, counters and metrics."""

from __future__ import annotations

from octavo.engine.stats import EngineStats
from octavo.entrypoints.openai.engine_stats_collector import EngineStatsCollector
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.outputs import ModelRunnerOutput
from octavo.sampling_params import SamplingParams
from octavo.scheduler.scheduler import Scheduler
from octavo.scheduler.sequence import Sequence
from octavo.scheduler.spec_decode_counters import SpecDecodeCounters
from octavo.scheduler.speculation_policy import SpeculationPolicy
from octavo.scheduler.stop_checker import StopLimits

BLOCK = 4
EOS = 2


def started(prompt_len=6, budget=32, lookahead=0, max_model_len=64, num_blocks=64, **params):
    """A scheduler whose one sequence has its prompt computed and a first token (7)."""
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK)
    limits = StopLimits(frozenset({EOS}), max_model_len)
    scheduler = Scheduler(kv, 8, budget, limits, lookahead)
    seq = Sequence(
        1,
        "r1",
        0,
        list(range(10, 10 + prompt_len)),
        prompt_len,
        SamplingParams(ignore_eos=False, **params),
    )
    scheduler.add(seq)
    out = scheduler.schedule()
    scheduler.update_from_output(out, ModelRunnerOutput([1], [7], [None]), 0.0)
    return scheduler, seq


def propose(scheduler, seq, tokens):
    seq.spec_token_ids = list(tokens)
    return scheduler.schedule()


def test_a_decoding_sequence_verifies_its_proposals_after_its_last_token():
    scheduler, seq = started()
    out = propose(scheduler, seq, [8, 9, 11])
    (scheduled,) = out.decodes
    assert scheduled.token_ids == [7, 8, 9, 11] and scheduled.num_spec_tokens == 3
    assert scheduled.num_computed_tokens == 6 and out.num_batched_tokens == 4


def test_kept_tokens_advance_the_sequence_and_rejected_slots_are_rolled_back():
    scheduler, seq = started()
    out = propose(scheduler, seq, [8, 9, 11])
    kept = ModelRunnerOutput([1, 1, 1], [8, 9, 30], [None] * 3)  # 2 accepted, then 30
    updates = scheduler.update_from_output(out, kept, 0.0)
    assert [u.token_id for u in updates] == [8, 9, 30]
    assert seq.token_ids[6:] == [7, 8, 9, 30]
    assert seq.num_computed_tokens == 9  # 7, 8, 9 computed; 11's slot will be written over
    assert scheduler.spec_counters == SpecDecodeCounters(1, 3, 2, [1, 1, 0])
    assert scheduler.schedule().decodes[0].token_ids == [30]  # no proposals this time


def test_proposals_stop_at_max_tokens_the_context_and_the_budget():
    scheduler, seq = started(max_tokens=3)
    assert propose(scheduler, seq, [8, 9, 11, 12]).decodes[0].token_ids == [7, 8]
    scheduler, seq = started(max_model_len=9)
    assert propose(scheduler, seq, [8, 9, 11, 12]).decodes[0].token_ids == [7, 8]
    scheduler, seq = started(prompt_len=3, budget=3)
    assert propose(scheduler, seq, [8, 9, 11, 12]).decodes[0].token_ids == [7, 8, 9]


def test_tokens_after_a_finishing_token_are_dropped():
    scheduler, seq = started()
    out = propose(scheduler, seq, [EOS, 9])
    updates = scheduler.update_from_output(
        out, ModelRunnerOutput([1] * 3, [EOS, 9, 5], [None] * 3), 0.0
    )
    assert [u.token_id for u in updates] == [EOS] and seq.finish_reason == "stop"
    assert scheduler.kv.pool.num_free_blocks == scheduler.kv.pool.num_usable_blocks


def test_a_draft_model_gets_slots_ahead_and_preemption_clears_proposals():
    scheduler, seq = started(prompt_len=4, lookahead=3)
    assert len(scheduler.kv.block_ids(1)) == 2  # 4 prompt tokens + 1 + 3 ahead: 8 slots
    out = propose(scheduler, seq, [8, 9])
    assert len(out.decodes[0].block_ids) * BLOCK >= 4 + 3 + 3
    scheduler.preempt(seq)
    assert seq.spec_token_ids == [] and seq.num_computed_tokens == 0


def test_spec_decode_metrics_have_vllm_names():
    counters = SpecDecodeCounters(4, 12, 7, [4, 2, 1])
    stats = EngineStats(1, 0, 0.1, 10, 16, 64, 0, 0, 0, 5, 9, spec_decode=counters)
    collector = EngineStatsCollector("m")
    collector.update(stats)
    samples = {
        (s.name, s.labels.get("position")): s.value
        for metric in collector.collect()
        for s in metric.samples
    }
    assert samples[("vllm:spec_decode_num_drafts_total", None)] == 4
    assert samples[("vllm:spec_decode_num_draft_tokens_total", None)] == 12
    assert samples[("vllm:spec_decode_num_accepted_tokens_total", None)] == 7
    per_position = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert [samples[(per_position, str(i))] for i in range(3)] == [4, 2, 1]
    assert counters.acceptance_rate == 7 / 12 and counters.mean_accepted_length == 1 + 7 / 4
    collector.update(EngineStats(1, 0, 0.1, 10, 16, 64, 0, 0, 0, 5, 9))
    assert not any(m.name.startswith("vllm:spec_decode") for m in collector.collect())


def test_in_a_large_batch_poorly_accepted_proposals_are_held_back_and_probed():
    policy = SpeculationPolicy(small_batch=4, min_acceptance=0.75, probe_interval=3)
    seq = Sequence(1, "r", 0, [1, 2, 3], 3, SamplingParams(), spec_token_ids=[5, 6, 7, 8])
    assert policy.how_many(seq, num_running=20) == 4  # starts at the bar: verified
    policy.record(seq, 4, 0)
    assert policy.how_many(seq, num_running=2) == 4  # a small batch verifies everything
    assert [policy.how_many(seq, num_running=20) for _ in range(6)] == [0, 0, 2, 0, 0, 2]
    for _ in range(5):
        policy.record(seq, 2, 2)  # the probes were accepted: it speculates again
    assert policy.how_many(seq, num_running=20) == 4
