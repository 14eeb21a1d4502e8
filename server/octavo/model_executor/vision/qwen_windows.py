"""Qwen2.5-VL's vision token order and attention segments, from the images' patch grids.

Patches arrive grouped by spatial-merge unit (``merge x merge`` neighbours, which the patch
merger later folds into one feature). Window layers attend within square windows of
``window`` merge units per side (the last row and column of windows may be smaller);
the tower reorders the merge units window by window so each window is one contiguous
segment, and restores the order after the merger. Full-attention layers attend within
each image frame (``h * w`` patches). All images of a call go through the tower together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def segment_mask(lengths: list[int], device: torch.device) -> torch.Tensor | None:
    """Bool ``[tokens, tokens]``: True within each segment (None: one segment, no mask)."""
    if len(lengths) == 1:
        return None
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    ids = ids.to(device)
    return ids[:, None] == ids[None, :]


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
