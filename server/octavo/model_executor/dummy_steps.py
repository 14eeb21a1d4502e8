"""Dummy steps on one block of the KV cache: inputs of any shape with nothing to hold.

Start-up runs steps of chosen shapes through the model before any request holds a block
(``worker/kernel_warm_up.py`` compiles the kernels of each shape class, ``piecewise_graphs``
records and checks its pieces). Every block table entry of such a step is block 1 (block 0
is the null block, which padded decode rows read): the keys and values the step writes are
garbage left in a free block, and what it reads is whatever that block holds. Tokens that
share a slot race for it, so a step whose outputs are compared takes blocks of its own
(``distinct``: blocks 1, 2, 3, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from octavo.kv_cache.state_tensors import has_state_caches
from octavo.model_executor.group_tables import add_group_tables
from octavo.model_executor.paged_model import PagedModel
from octavo.model_executor.step_inputs import StepInputs, add_state_slots, lay_out, step_inputs
from octavo.scheduler.output import ScheduledSequence

DUMMY_BLOCK = 1


@dataclass(frozen=True)
class DummyShape:
    """A step's ``(cached tokens, new tokens)`` per sequence, prompt chunks first."""

    sequences: tuple[tuple[int, int], ...]

    @property
    def num_prefills(self) -> int:
        return sum(1 for _, new in self.sequences if new > 1)

    @property
    def tokens(self) -> int:
        return sum(new for _, new in self.sequences)


def prompt_chunks(tokens: int, max_model_len: int) -> list[int]:
    """``tokens`` as prompts of at most ``max_model_len`` tokens (full ones, then the rest)."""
    full, rest = divmod(tokens, max_model_len)
    return [max_model_len] * full + ([rest] if rest else [])


def scheduled(
    shape: DummyShape, block_size: int, num_groups: int = 0, distinct: bool = False
) -> list[ScheduledSequence]:
    """The shape's sequences, every block table entry on ``DUMMY_BLOCK`` (in each of
    ``num_groups`` KV cache groups' tables too); ``distinct``: on blocks 1, 2, 3, ... each
    its own, so no two tokens share a slot and the step's outputs are deterministic."""
    sequences, next_block = [], DUMMY_BLOCK
    for seq_id, (cached, new) in enumerate(shape.sequences):
        count = math.ceil((cached + new) / block_size)
        blocks = [DUMMY_BLOCK] * count
        if distinct:
            blocks, next_block = list(range(next_block, next_block + count)), next_block + count
        groups = tuple([blocks] * num_groups) if num_groups else None
        sequences.append(
            ScheduledSequence(seq_id, [0] * new, cached, blocks, True, group_block_ids=groups)
        )
    return sequences


def blocks_needed(shape: DummyShape, block_size: int) -> int:
    """Blocks of a ``distinct`` layout of the shape (the null block not counted)."""
    return sum(math.ceil((cached + new) / block_size) for cached, new in shape.sequences)


def dummy_inputs(model: PagedModel, shape: DummyShape, distinct: bool = False) -> StepInputs:
    """The step's inputs for ``model`` (each sequence's last token sampled)."""
    groups, size, device = model.layer_groups, model.block_size, model.device
    sequences = scheduled(shape, size, 0 if groups is None else max(groups) + 1, distinct)
    inputs = step_inputs(lay_out(sequences, size), shape.num_prefills, device)
    if has_state_caches(model.kv_caches):  # state layers: every sequence on the null slot
        add_state_slots(inputs.meta, sequences, device)
    if groups is not None:  # KV cache groups: a table each
        add_group_tables(inputs.meta, sequences, groups, size, device)
    return inputs
