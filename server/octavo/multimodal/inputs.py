"""One image of a request as the engine carries it: plain data that crosses processes.

The HF processor expands each image into placeholder tokens in the prompt, one per image
feature. Most models put them in one run; some put text tokens between an image's runs
(SmolVLM's tile markers, Pixtral's row breaks). ``ImageInput`` keeps the range from the
image's first placeholder to its last (``offset``, ``length``), which positions of that
range take features (``embed_mask``; None when all do), the processor's tensors for this
image as the vision tower takes them (``data``: ``pixel_values`` and, by model,
``image_sizes``, ``image_grid_thw``, ...) and the image's content hash (the key of the
encoder cache and part of the prefix-cache block hashes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the API process of a text model does without
    import torch


@dataclass
class ImageInput:
    content_hash: str  # sha256 of the decoded pixels, size and mode (image_hash)
    offset: int  # the first placeholder token's position in the prompt
    length: int  # positions from the first placeholder to the last, both included
    data: dict[str, torch.Tensor]  # the processor's tensors for this image
    embed_mask: torch.Tensor | None = None  # bool [length]: positions taking features

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def pixel_values(self) -> torch.Tensor:
        return self.data["pixel_values"]

    @property
    def num_features(self) -> int:
        return self.length if self.embed_mask is None else int(self.embed_mask.sum())

    def overlap(self, start: int, end: int) -> tuple[int, int] | None:
        """The part of positions ``[start, end)`` its placeholder range covers (None: none)."""
        first, last = max(start, self.offset), min(end, self.end)
        return (first, last) if first < last else None

    def features_in(self, first: int, last: int) -> tuple[torch.Tensor, int]:
        """For positions ``[first, last)`` inside the range: the offsets (from ``first``)
        of those that take features, and the index of the first of those features."""
        import torch

        begin, stop = first - self.offset, last - self.offset
        if self.embed_mask is None:
            return torch.arange(stop - begin), begin
        taken = self.embed_mask[begin:stop].nonzero().flatten()
        return taken, int(self.embed_mask[:begin].sum())


def placeholder_runs(token_ids: list[int], placeholder_id: int) -> list[tuple[int, int]]:
    """(offset, length) of each run of ``placeholder_id`` in ``token_ids``, in order."""
    runs: list[tuple[int, int]] = []
    for position, token in enumerate(token_ids):
        if token != placeholder_id:
            continue
        if runs and runs[-1][0] + runs[-1][1] == position:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((position, 1))
    return runs


def placeholder_spans(
    token_ids: list[int], placeholder_id: int, counts: list[int]
) -> list[tuple[int, int, torch.Tensor | None]]:
    """(offset, length, embed_mask) of each image whose ``counts[i]`` placeholders come in
    order, possibly with other tokens between them (mask None: one unbroken run)."""
    positions = [index for index, token in enumerate(token_ids) if token == placeholder_id]
    if sum(counts) != len(positions):
        raise ValueError(
            f"the prompt has {len(positions)} image placeholder tokens where its images need "
            f"{sum(counts)}"
        )
    import torch

    spans, used = [], 0
    for count in counts:
        mine = positions[used : used + count]
        used += count
        offset, length = mine[0], mine[-1] - mine[0] + 1
        if length == count:
            spans.append((offset, length, None))
            continue
        mask = torch.zeros(length, dtype=torch.bool)
        mask[torch.tensor(mine) - offset] = True
        spans.append((offset, length, mask))
    return spans
