"""A step's block tables and slot mappings per KV cache group (``kv_cache_groups``).

A hybrid model whose sliding and full layers keep a block table each gets one
``AttentionMetadata`` per group: the step's own with that group's slot mapping and block
tables (and a backend cache of its own, as backends derive values from the tables), and
each layer reads its group's (``AttentionMetadata.layer_metas``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from octavo.attention.metadata import AttentionMetadata
from octavo.model_executor.step_inputs import lay_out, padded_tables
from octavo.sampling.host_lists import to_device
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
    padded = padded_tables(layout.tables)
    packed = np.concatenate([np.array(layout.slots, dtype=np.int64), padded.ravel()])
    slots, flat_tables = to_device(torch.from_numpy(packed), device).split(
        [len(layout.slots), padded.size]
    )
    return dataclasses.replace(
        meta,
        slot_mapping=slots,
        block_tables=flat_tables.to(torch.int32).view(padded.shape),
        backend_cache={},
        layer_metas=None,
    )
