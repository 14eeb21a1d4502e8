"""Qwen2.5-VL's vision token order and attention segments, from the images' patch grids.

Patches arrive grouped by spatial-merge unit (``merge x merge`` neighbours, which the patch
merger later folds into one feature). Window layers attend within square windows of
``window`` merge units per side (the last row and column of windows may be smaller);
the tower reorders the merge units window by window so each window is one contiguous
segment, and restores the order after the merger. Full-attention layers attend within
each image frame (``h * w`` patches). All images of a call go through the tower together;
a layer runs each segment as a row of a batch (``run_in_segments``), never a mask.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [tokens, head_dim]


@dataclass
class WindowPlan:
    order: torch.Tensor  # [merge units] the units in window order
    window_lengths: list[int]  # patches per window, in that order
    frame_lengths: list[int]  # patches per image frame (full-attention segments)


def window_plan(grids: list[tuple[int, int, int]], merge: int, window: int) -> WindowPlan:
    """``grids``: each image's (t, h, w) in patches; ``window``: merge units per side."""
    order, window_lengths, frame_lengths, first = [], [], [], 0
    unit = merge * merge
    for t, h, w in grids:
        rows, cols = h // merge, w // merge
        units = torch.arange(t * rows * cols).view(t, rows, cols) + first
        for frame in units:
            for top in range(0, rows, window):
                for left in range(0, cols, window):
                    block = frame[top : top + window, left : left + window].flatten()
                    order.append(block)
                    window_lengths.append(block.numel() * unit)
        frame_lengths += [h * w] * t
        first += t * rows * cols
    return WindowPlan(torch.cat(order), window_lengths, frame_lengths)


def run_in_segments(
    layer: nn.Module, hidden: torch.Tensor, rotation: Rope, lengths: list[int]
) -> torch.Tensor:
    """An encoder ``layer`` over ``hidden [tokens, width]`` with attention within each
    segment of ``lengths`` only: each segment runs as its own row of a batch (segments of
    one length together), so no ``[tokens, tokens]`` mask is built. ``rotation``: each
    token's cos/sin, carried with it."""
    starts = [0, *itertools.accumulate(lengths)]
    groups: dict[int, list[int]] = {}
    for index, length in enumerate(lengths):
        groups.setdefault(length, []).append(index)
    out = torch.empty_like(hidden)
    for length, members in groups.items():
        rows = torch.cat([torch.arange(starts[i], starts[i] + length) for i in members])
        rows = rows.to(hidden.device)
        shape = (len(members), length, -1)
        rope = tuple(table[rows].view(len(members), 1, length, -1) for table in rotation)
        out[rows] = layer(hidden[rows].view(shape), None, rope).flatten(0, 1)
    return out


def patch_coordinates(grids: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """``[patches, 2]`` each patch's (row, column) in its image, in the processor's order
    (merge unit by merge unit, row-major within a unit; every frame alike)."""
    coordinates = []
    for t, h, w in grids:
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        pairs = torch.stack([rows.transpose(1, 2), cols.transpose(1, 2)], dim=-1)
        coordinates.append(pairs.reshape(-1, 2).repeat(t, 1))
    return torch.cat(coordinates)
