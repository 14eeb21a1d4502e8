"""M-RoPE positions: a prompt's 3-D positions, computed once, and each step's ``[3, tokens]``.

As transformers' ``get_rope_index`` (Qwen2-VL family): text tokens count on from the
previous token's position on all three axes; an image's placeholders are its feature grid
(``t x h x w`` after the spatial merge, row-major) at ``start + (t, h, w)``, and the text
after it starts at ``start + max(h, w)`` (images have ``t = 1``). So a prompt's positions
end below its length, by ``delta`` (``mrope_position_delta``, <= 0 with images).

As vLLM's GPU model runner: the runner computes a prompt's positions when it first sees
the sequence (they depend only on its token ids and its images' grids) and keeps them
until the sequence finishes. Each step's positions are the prompt's for the prompt rows a
chunk covers (a chunked prefill takes its slice; a recompute after preemption takes them
again) and ``position + delta`` on all three axes for generated tokens (decode rows,
verified proposals). A sequence without images has no entry: its positions are the plain
ones on every axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from octavo.multimodal.inputs import ImageInput
from octavo.scheduler.output import NewSequenceData, ScheduledSequence


@dataclass(frozen=True)
class FeatureGrid:
    """An image's placeholder run as the language model's grid of features."""

    offset: int  # the first placeholder's position in the prompt
    t: int
    h: int
    w: int

    @property
    def length(self) -> int:
        return self.t * self.h * self.w


@dataclass
class PromptPositions:
    positions: torch.Tensor  # [3, prompt tokens] int64
    delta: int  # generated token at position p has p + delta on every axis


class SupportsMRoPE(Protocol):
    """A model whose rope takes 3-D positions (``mrope_rotary.MRotaryEmbedding``)."""

    def mrope_grids(self, images: list[ImageInput]) -> list[FeatureGrid]: ...


def supports_mrope(model: object) -> bool:
    return callable(getattr(model, "mrope_grids", None))


def grid_positions(grid: FeatureGrid, start: int) -> torch.Tensor:
    """``[3, t*h*w]``: each feature's (t, h, w) in row-major order, plus ``start``."""
    t, h, w = torch.meshgrid(
        torch.arange(grid.t), torch.arange(grid.h), torch.arange(grid.w), indexing="ij"
    )
    return torch.stack([t, h, w]).reshape(3, -1) + start


def prompt_positions(num_tokens: int, grids: list[FeatureGrid]) -> PromptPositions:
    """The 3-D positions of a prompt of ``num_tokens`` whose images are ``grids`` (in order)."""
    pieces, cursor, next_position = [], 0, 0
    for grid in grids:
        text = grid.offset - cursor
        pieces.append(torch.arange(text).expand(3, -1) + next_position)
        next_position += text
        pieces.append(grid_positions(grid, next_position))
        next_position += max(grid.h, grid.w)
        cursor = grid.offset + grid.length
    pieces.append(torch.arange(num_tokens - cursor).expand(3, -1) + next_position)
    positions = torch.cat(pieces, dim=1)
    delta = int(positions.max()) + 1 - num_tokens if num_tokens else 0
    return PromptPositions(positions, delta)


class MRopePositions:
    """Every running sequence's prompt positions (the runner's, one per sequence)."""

    def __init__(self, model: SupportsMRoPE) -> None:
        self.model = model
        self.prompts: dict[int, PromptPositions] = {}

    def add(self, data: NewSequenceData) -> None:
        if data.images:
            grids = self.model.mrope_grids(data.images)
            self.prompts[data.seq_id] = prompt_positions(len(data.prompt_token_ids), grids)

    def forget(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self.prompts.pop(seq_id, None)

    def step_positions(
        self, scheduled: list[ScheduledSequence], seq_starts: list[int], flat: list[int]
    ) -> torch.Tensor:
        """``[3, tokens]`` for a step whose plain positions are ``flat``."""
        positions = torch.tensor(flat, dtype=torch.long).expand(3, -1).clone()
        for first, seq in zip(seq_starts, scheduled, strict=True):
            prompt = self.prompts.get(seq.seq_id)
            if prompt is not None:
                self._place(positions[:, first : first + seq.num_new_tokens], seq, prompt)
        return positions

    @staticmethod
    def _place(rows: torch.Tensor, seq: ScheduledSequence, prompt: PromptPositions) -> None:
        """A chunk's rows: the prompt's positions it covers, then generated ones + delta."""
        start = seq.num_computed_tokens
        in_prompt = max(0, min(prompt.positions.shape[1] - start, rows.shape[1]))
        rows[:, :in_prompt] = prompt.positions[:, start : start + in_prompt]
        rows[:, in_prompt:] += prompt.delta
