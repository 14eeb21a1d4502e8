"""``lay_out``'s single-token rows (``_add_decode``) must lay out exactly what the general
chunk path does for the same sequences, mixed with prompt chunks and verifications."""

from __future__ import annotations

import random

from octavo.model_executor.step_inputs import StepLayout, _add_chunk, lay_out
from octavo.scheduler.output import ScheduledSequence

BLOCK = 4


def _random_step(rng: random.Random) -> list[ScheduledSequence]:
    step = []
    for seq_id in range(40):
        computed = rng.randint(0, 30)
        num_new = rng.choice([1, 1, 1, 3, 5])
        spec = rng.choice([0, 0, 2]) if num_new > 1 else 0
        num_blocks = -(-(computed + num_new) // BLOCK)
        step.append(
            ScheduledSequence(
                seq_id=seq_id,
                token_ids=[rng.randint(1, 99) for _ in range(num_new)],
                num_computed_tokens=computed,
                block_ids=rng.sample(range(1, 500), num_blocks),
                sample=rng.random() < 0.9,
                num_spec_tokens=spec,
            )
        )
    return step


def test_single_token_rows_match_the_general_chunk_path():
    rng = random.Random(0)
    for _ in range(5):
        step, pooling = _random_step(rng), {3, 7}
        expected = StepLayout()
        for seq in step:
            _add_chunk(expected, seq, BLOCK, seq.sample and seq.seq_id not in pooling)
        assert lay_out(step, BLOCK, pooling) == expected


def test_a_decode_row_writes_its_slot_in_the_block_of_its_position():
    seq = ScheduledSequence(
        seq_id=0, token_ids=[7], num_computed_tokens=5, block_ids=[9, 4], sample=True
    )
    layout = lay_out([seq], BLOCK)
    assert layout.slots == [4 * BLOCK + 1] and layout.positions == [5]
    assert layout.starts == [0, 1] and layout.seq_lens == [6] and layout.logits_rows == [0]
