"""A step's block tables and slot mappings per KV cache group (``kv_cache_groups``).

A hybrid model whose sliding and full layers keep a block table each gets one
``AttentionMetadata`` per group: the step's own with that group's slot mapping and block
tables (and a backend cache of its own, as backends derive values from the tables), and
each layer reads its group's (``AttentionMetadata.layer_metas``).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from octavo.attention.metadata import AttentionMetadata
from octavo.model_executor.step_inputs import lay_out
from octavo.sampling.host_lists import device_tensor
from octavo.scheduler.output import ScheduledSequence


def add_group_tables(
    meta: AttentionMetadata,
    scheduled: list[ScheduledSequence],
    layer_groups: list[int],
    block_size: int,
    device: torch.device,
) -> None:
    """Set ``meta.layer_metas``: each layer's group's metadata (``layer_groups[i]``: the
    group of layer ``i``)."""
    num_groups = len(scheduled[0].group_block_ids or ())
    metas = [_group_meta(meta, scheduled, group, block_size, device) for group in range(num_groups)]
    meta.layer_metas = [metas[group] for group in layer_groups]


def _group_meta(
    meta: AttentionMetadata,
    scheduled: list[ScheduledSequence],
    group: int,
    block_size: int,
    device: torch.device,
) -> AttentionMetadata:
    tables = [dataclasses.replace(seq, block_ids=seq.group_block_ids[group]) for seq in scheduled]
    layout = lay_out(tables, block_size)
    width = max(len(table) for table in layout.tables)
    padded = [value for table in layout.tables for value in table + [0] * (width - len(table))]
    packed = device_tensor(list(itertools.chain(layout.slots, padded)), torch.long, device)
    slots, flat_tables = packed.split([len(layout.slots), len(padded)])
    return dataclasses.replace(
        meta,
        slot_mapping=slots,
        block_tables=flat_tables.to(torch.int32).view(len(layout.tables), width),
        backend_cache={},
        layer_metas=None,
    )
