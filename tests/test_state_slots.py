"""State layers' plumbing: the varlen causal conv1d with per-slot state; state slots taken
at admission (a sequence without one waits), freed at finish and preemption, copied at
fork; the step's slot fields; the per-layer cache list and the fork copies."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.metadata import AttentionMetadata
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.cache_tensors import copy_blocks
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.kv_cache.state_slots import StateSlots, StateSpec
from octavo.kv_cache.state_tensors import copy_states, layer_caches, state_bytes
from octavo.model_executor.layers.state.causal_conv1d import causal_conv1d
from octavo.model_executor.step_inputs import add_state_slots
from octavo.scheduler.output import ScheduledSequence
from octavo.scheduler.scheduler import Scheduler
from octavo.scheduler.stop_checker import StopLimits
from state_steps import state_step_metadata
from test_scheduler import BLOCK, finish_step, make_seq

CHANNELS, KERNEL, NUM_SLOTS = 6, 4, 8


def state_meta(
    query_lens: list[int], slots: list[int], has_initial: list[bool]
) -> AttentionMetadata:
    """A step whose sequences are as long as their new tokens (``state_step_metadata``)."""
    return state_step_metadata(query_lens, query_lens, slots, has_initial)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One whole sequence ``x [length, channels]`` through a zero-padded causal conv."""
    out = F.conv1d(x.t()[None], weight[:, None], bias, padding=KERNEL - 1, groups=CHANNELS)
    return out[0, :, : x.shape[0]].t()


def test_causal_conv1d_chunks_and_decodes_match_whole_sequences() -> None:
    """Three sequences of lengths 7, 2 and 5 go through in pieces (chunks shorter and
    longer than the kernel, then decodes batched beside a chunk): each piece's output
    equals the same rows of the whole sequence's conv; a stale slot is ignored when the
    sequence has no initial state."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(CHANNELS, KERNEL, generator=generator)
    bias = torch.randn(CHANNELS, generator=generator)
    seqs = [torch.randn(n, CHANNELS, generator=generator) for n in (7, 2, 5)]
    state = torch.randn(NUM_SLOTS, CHANNELS, KERNEL - 1, generator=generator)  # stale
    slots = [3, 5, 1]
    steps = [  # per step: (sequence, start, length), prefill chunks before decodes
        [(0, 0, 2), (1, 0, 2)],
        [(0, 2, 3), (2, 0, 4), (1, 2, 0)],
        [(0, 5, 1), (2, 4, 1)],
        [(0, 6, 1)],
    ]
    done = [0, 0, 0]
    for step in steps:
        pieces = [(i, start, n) for i, start, n in step if n]
        meta = state_meta(
            [n for _, _, n in pieces],
            [slots[i] for i, _, _ in pieces],
            [s > 0 for _, s, _ in pieces],
        )
        x = torch.cat([seqs[i][start : start + n] for i, start, n in pieces])
        out = causal_conv1d(x, weight, bias, state, meta, activation="silu")
        expected = torch.cat(
            [F.silu(reference(seqs[i], weight, bias))[s : s + n] for i, s, n in pieces]
        )
        torch.testing.assert_close(out, expected)
        for i, _, n in pieces:
            done[i] += n
    assert done == [7, 2, 5]
    for i, seq in enumerate(seqs):  # each slot keeps the sequence's last kernel-1 inputs
        padded = torch.cat([torch.zeros(KERNEL - 1, CHANNELS), seq])
        torch.testing.assert_close(state[slots[i]], padded[-(KERNEL - 1) :].t())
    assert state[0].abs().sum() > 0  # untouched rows keep what they held


def state_scheduler(num_slots: int, num_blocks: int = 64, max_num_seqs: int = 8) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks, enable_prefix_caching=False), BLOCK)
    kv.state_slots = StateSlots(num_slots)
    return Scheduler(kv, max_num_seqs, 100, StopLimits(frozenset(), 64))


def slots(out) -> dict[int, int]:
    return {s.seq_id: s.state_slot for s in out.scheduled}


def test_a_sequence_without_a_free_slot_waits_and_finishing_frees_one() -> None:
    scheduler = state_scheduler(num_slots=3)  # the null slot and two
    seqs = [make_seq(i, 5) for i in (1, 2, 3)]
    for seq in seqs:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert slots(out) == {1: 1, 2: 2}
    assert list(scheduler.waiting) == [seqs[2]] and 3 not in scheduler.kv.tables
    finish_step(scheduler, out)
    scheduler.finish(seqs[0])
    assert slots(scheduler.schedule()) == {2: 2, 3: 1}


def test_preemption_frees_the_slot_and_the_recompute_starts_from_zero() -> None:
    scheduler = state_scheduler(num_slots=4, num_blocks=5)  # 4 blocks: two 8-token prompts
    first, second = make_seq(1, 8), make_seq(2, 8)
    scheduler.add(first)
    scheduler.add(second)
    finish_step(scheduler, scheduler.schedule())
    out = scheduler.schedule()  # each needs a third block: the newest is preempted
    assert out.preempted_seq_ids == [2] and slots(out) == {1: 1}
    assert not scheduler.kv.state_slots.holds(2) and scheduler.kv.state_slots.num_free == 2
    finish_step(scheduler, out)
    scheduler.finish(first)
    (again,) = scheduler.schedule().scheduled
    assert again.seq_id == 2 and again.num_computed_tokens == 0
    meta = state_meta([again.num_new_tokens], [0], [True])
    add_state_slots(meta, [again], torch.device("cpu"))
    assert meta.state_slots.tolist() == [again.state_slot] and not meta.state_has_initial[0]


def test_forks_get_slots_of_their_own_holding_a_copy_of_the_parent_state() -> None:
    scheduler = state_scheduler(num_slots=5, max_num_seqs=4)
    scheduler.add(make_seq(100, 5, n=3))  # an id the forks' (from 0) do not reach
    first = scheduler.schedule()
    assert slots(first) == {100: 1} and first.state_copies == []
    finish_step(scheduler, first)  # the prompt is computed: two forks
    out = scheduler.schedule()
    children = [s for s in out.scheduled if s.seq_id != 100]
    assert len(children) == 2
    assert out.state_copies == [(1, s.state_slot) for s in children]
    assert sorted(slots(out).values()) == [1, 2, 3]
    meta = state_meta([1, 1, 1], [0, 0, 0], [False] * 3)
    add_state_slots(meta, out.scheduled, torch.device("cpu"))
    assert meta.state_has_initial.all()  # the forks start from the copied prompt state


def test_layer_caches_interleave_kv_tensors_and_states_and_copies_reach_only_states() -> None:
    specs = [StateSpec(((3, 2),)), None, StateSpec(((2,), (2, 2)), torch.float64)]
    kv = [torch.arange(2 * 4 * 1 * 1 * 2.0).view(2, 4, 1, 1, 2)]
    caches = layer_caches(kv, specs, 4, torch.float32, torch.device("cpu"))
    assert caches[1] is kv[0]
    assert [t.shape for t in caches[0]] == [(4, 3, 2)]
    shapes = [(tuple(t.shape), t.dtype) for t in caches[2]]
    assert shapes == [((4, 2), torch.float64), ((4, 2, 2), torch.float64)]
    assert state_bytes(specs, 4, torch.float32) == 4 * (6 * 4 + 6 * 8)
    for state in (caches[0], caches[2]):
        for tensor in state:
            tensor[1] = 5.0
    copy_states(caches, [(1, 3)])
    assert all(bool((t[3] == 5.0).all()) and bool((t[2] == 0).all()) for t in caches[0] + caches[2])
    copy_blocks(caches, [(0, 2)])  # copy-on-write blocks: the KV tensor only
    assert torch.equal(kv[0][:, 2], kv[0][:, 0])


def test_step_slot_fields_follow_the_step_order() -> None:
    scheduled = [
        ScheduledSequence(7, [1, 2, 3], 0, [1], sample=True, state_slot=4),
        ScheduledSequence(8, [5], 9, [2], sample=True, state_slot=2),
    ]
    meta = state_meta([3, 1], [0, 0], [False, False])
    add_state_slots(meta, scheduled, torch.device("cpu"))
    assert meta.state_slots.tolist() == [4, 2] and meta.state_slots.dtype == torch.long
    assert meta.state_has_initial.tolist() == [False, True]
