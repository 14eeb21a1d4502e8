"""Multimodal rope (M-RoPE) of Qwen2-VL, Qwen2.5-VL and Qwen3-VL.

Every token has three positions, temporal, height and width (``[3, tokens]``); a text
token's three are equal. Each rotary frequency takes its angle from one of the three:
``mrope_section`` counts the frequencies of each axis, either in three consecutive bands
(Qwen2/2.5-VL: ``t..t h..h w..w``) or interleaved (Qwen3-VL: ``t h w t h w ... t t``).

The cos/sin tables are the plain rope's (one row per position); a step's rows are
gathered per axis and the frequency columns picked from their axis, so the rotation
itself is the plain rope's (the native kernel reads the step's rows). With 1-D positions
(a text-only step, or decode-graph capture) it is the plain rope.
"""

from __future__ import annotations

import torch

from octavo.model_executor.rotary import RotaryEmbedding, RotaryStep


def mrope_axes(section: list[int], num_frequencies: int, interleaved: bool) -> torch.Tensor:
    """Each rotary dimension's axis (0 temporal, 1 height, 2 width): ``[2 * num_frequencies]``."""
    if sum(section) != num_frequencies or len(section) != 3:
        raise ValueError(
            f"mrope_section {section} must be three counts summing to {num_frequencies} "
            "(half the rotary dimensions)"
        )
    if interleaved:
        index = torch.arange(num_frequencies)
        axes = torch.zeros(num_frequencies, dtype=torch.long)
        for axis in (1, 2):
            axes[(index % 3 == axis) & (index < 3 * section[axis])] = axis
    else:
        axes = torch.repeat_interleave(torch.arange(3), torch.tensor(section))
    return torch.cat([axes, axes])


class MRotaryEmbedding(RotaryEmbedding):
    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        rope: dict,
        dtype: torch.dtype,
        device: torch.device,
        interleaved: bool = False,
    ) -> None:
        plain = {**rope, "rope_type": _plain_type(rope.get("rope_type"))}
        super().__init__(head_dim, max_positions, plain, dtype, device)
        section = list(rope.get("mrope_section") or [])
        self.axes = mrope_axes(section, self.rotary_dim // 2, interleaved).to(device)

    def for_step(self, positions: torch.Tensor) -> RotaryStep:
        """``positions [3, tokens]`` (or ``[tokens]``: every axis alike)."""
        if positions.dim() == 1:
            return super().for_step(positions)
        cos, sin = self.step_rows(positions)
        rows = torch.arange(positions.shape[1], device=positions.device)
        return RotaryStep.over(self.rotary_dim, rows, cos, sin)

    def step_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[tokens, rotary_dim]`` cos and sin: each column from its axis' position."""
        index = self.axes.expand(positions.shape[1], -1).unsqueeze(0)
        cos = self.cos[positions].gather(0, index).squeeze(0)
        sin = self.sin[positions].gather(0, index).squeeze(0)
        return cos, sin


def _plain_type(rope_type: str | None) -> str:
    """Old configs name the type ``mrope``: its frequencies are the default rope's."""
    return "default" if rope_type in (None, "mrope") else rope_type
