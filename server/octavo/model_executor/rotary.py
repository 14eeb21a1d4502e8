"""Rotary position embeddings (RoPE), including Llama-3's frequency scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from octavo.kernels.cpu_build import ops_for


def inverse_frequencies(head_dim: int, rope: dict) -> torch.Tensor:
    base = float(rope["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = rope["rope_type"]
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope["factor"])
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    raise ValueError(f"unsupported rope_type {rope_type!r} (supported: default, linear, llama3)")


def _llama3_scaled(inv_freq: torch.Tensor, rope: dict) -> torch.Tensor:
    """Long wavelengths are divided by ``factor``, short ones kept, the band between blended."""
    factor = float(rope["factor"])
    low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    original = float(rope["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(in_band, blended, scaled)


class RotaryEmbedding:
    """Precomputed cos/sin tables for every position up to ``max_positions``."""

    def __init__(self, head_dim: int, max_positions: int, rope: dict, dtype, device) -> None:
        inv_freq = inverse_frequencies(head_dim, rope)
        positions = torch.arange(max_positions, dtype=torch.int64).float()
        freqs = torch.outer(positions, inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = angles.cos().to(dtype=dtype, device=device)
        self.sin = angles.sin().to(dtype=dtype, device=device)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows for the step's positions, shaped to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def for_step(self, positions: torch.Tensor) -> RotaryStep:
        """What every layer of one step needs to rotate its queries and keys."""
        ops = ops_for(self.cos)
        rows = self.tables(positions) if ops is None else None
        return RotaryStep(self, positions, ops, rows)


@dataclass
class RotaryStep:
    rotary: RotaryEmbedding
    positions: torch.Tensor  # [tokens] int64
    ops: object | None  # the native kernels, or None for the torch path
    rows: tuple[torch.Tensor, torch.Tensor] | None  # the torch path's cos/sin rows, once a step

    def apply_(self, qk: torch.Tensor) -> None:
        """Rotate ``qk [tokens, heads, head_dim]`` in place."""
        if self.ops is not None:
            self.ops.rotary_embedding(self.positions, qk, self.rotary.cos, self.rotary.sin)
            return
        cos, sin = self.rows
        qk.copy_(apply_rotary(qk, cos, sin))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
