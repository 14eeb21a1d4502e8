"""One image of a request as the engine carries it: plain data that crosses processes.

The HF processor expands each image into a run of placeholder tokens in the prompt (one
per image feature); ``ImageInput`` keeps where that run is (``offset``, ``length``), the
image's pixels as the vision tower takes them, and the image's content hash (the key of
the encoder cache and part of the prefix-cache block hashes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ImageInput:
    content_hash: str  # sha256 of the decoded pixels, size and mode (image_hash)
    offset: int  # the first placeholder token's position in the prompt
    length: int  # placeholder tokens: one per image feature
    pixel_values: torch.Tensor  # [channels, height, width], as the processor made them

    @property
    def end(self) -> int:
        return self.offset + self.length

    def overlap(self, start: int, end: int) -> tuple[int, int] | None:
        """The part of positions ``[start, end)`` its placeholders cover (None: none)."""
        first, last = max(start, self.offset), min(end, self.end)
        return (first, last) if first < last else None


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
