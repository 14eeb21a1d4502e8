"""Rotary position embeddings (RoPE): default, linear, Llama-3, YaRN, dynamic NTK, LongRoPE.

Everything a rope variant changes is folded into the precomputed cos/sin tables (one row per
position), so the torch path and the native kernel (``ops.rotary_embedding``) apply every
variant alike:

* the inverse frequencies follow ``transformers.modeling_rope_utils`` operation for
  operation;
* the attention factor (YaRN's mscale, LongRoPE's scaling) multiplies cos and sin in float32
  before the cast to the model dtype, as transformers' rotary modules do;
* with ``partial_rotary_factor`` only the first ``rotary_dim`` dimensions of a head rotate.

Two variants pick frequencies by sequence length in transformers; Octavo picks them per
position, so a token's rotation never depends on what else is in the batch:

* ``dynamic`` (NTK): transformers keeps the original frequencies while the batch is within
  ``max_position_embeddings`` and recomputes them from the batch's length beyond it. Octavo
  uses the original frequencies below ``max_position_embeddings`` (equal to transformers
  there) and, from that position on, vLLM's static choice: the frequencies transformers
  would compute for a length of ``max_position_embeddings * factor``.
* ``longrope`` (Phi-3/4): transformers takes the long factors for the whole batch once its
  length exceeds ``original_max_position_embeddings``. Octavo takes the short factors for
  positions below it and the long factors from it on (a position-indexed table, as vLLM's
  short/long cache is): equal to transformers for prompts within the original length and for
  every token decoded one at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from octavo.kernels.cpu_build import ops_for
from octavo.model_executor.rope_parameters import ROPE_TYPES

# --- frequencies -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeFrequencies:
    """One rope variant's inverse frequencies and the factor multiplying cos and sin."""

    inv_freq: torch.Tensor  # [rotary_dim // 2] float32; positions below ``long_from``
    attention_factor: float = 1.0
    long_inv_freq: torch.Tensor | None = None  # from position ``long_from`` on
    long_from: int | None = None

    @property
    def rotary_dim(self) -> int:
        return 2 * self.inv_freq.numel()


def rotary_dim_of(head_dim: int, rope: dict) -> int:
    """The leading dimensions of a head that rotate (``partial_rotary_factor`` of them)."""
    rotary_dim = int(head_dim * float(rope.get("partial_rotary_factor") or 1.0))
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(
            f"partial_rotary_factor {rope.get('partial_rotary_factor')} gives {rotary_dim} "
            f"rotary dimensions of head_dim {head_dim}: expected an even number in 2..{head_dim}"
        )
    return rotary_dim


def rope_frequencies(head_dim: int, rope: dict) -> RopeFrequencies:
    """The frequencies of ``rope`` (as ``rope_parameters_for`` returns it)."""
    rope_type = rope["rope_type"]
    if rope_type not in _FREQUENCIES:
        raise ValueError(
            f"unsupported rope_type {rope_type!r} (supported: {', '.join(ROPE_TYPES)})"
        )
    return _FREQUENCIES[rope_type](rotary_dim_of(head_dim, rope), rope)


def inverse_frequencies(head_dim: int, rope: dict) -> torch.Tensor:
    """The inverse frequencies of the first positions (below any long-context switch)."""
    return rope_frequencies(head_dim, rope).inv_freq


def _default_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _default(dim: int, rope: dict) -> RopeFrequencies:
    return RopeFrequencies(_default_inv_freq(dim, float(rope["rope_theta"])))


def _linear(dim: int, rope: dict) -> RopeFrequencies:
    return RopeFrequencies(
        _default_inv_freq(dim, float(rope["rope_theta"])) / float(rope["factor"])
    )


def _llama3(dim: int, rope: dict) -> RopeFrequencies:
    """Long wavelengths are divided by ``factor``, short ones kept, the band between blended."""
    inv_freq = _default_inv_freq(dim, float(rope["rope_theta"]))
    factor = float(rope["factor"])
    low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    original = float(rope["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelength >= original / high) & (wavelength <= original / low)
    return RopeFrequencies(torch.where(in_band, blended, scaled))


def _required(rope: dict, key: str) -> float:
    if rope.get(key) is None:
        raise ValueError(f"rope_type {rope['rope_type']!r} needs {key!r} in the rope settings")
    return float(rope[key])


def _scaling_factor(rope: dict) -> float:
    """``factor``, or the ratio of the context lengths where a config leaves it out."""
    if rope.get("factor") is not None:
        return float(rope["factor"])
    original = _required(rope, "original_max_position_embeddings")
    return _required(rope, "max_position_embeddings") / original


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_softmax_scale(head_dim: int, rope: dict) -> float:
    """DeepSeek's softmax scale (transformers' ``yarn_apply_mscale``): ``head_dim ** -0.5``,
    times ``mscale(factor, mscale_all_dim) ** 2`` when the rope is scaled and names
    ``mscale_all_dim`` (the queries' and keys' share of YaRN's temperature)."""
    scale = head_dim**-0.5
    mscale_all_dim = rope.get("mscale_all_dim")
    if rope.get("rope_type", "default") != "default" and mscale_all_dim:
        mscale = _yarn_mscale(float(rope["factor"]), float(mscale_all_dim))
        scale = scale * mscale * mscale
    return scale


def _yarn_attention_factor(rope: dict, factor: float) -> float:
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if mscale and mscale_all_dim:  # DeepSeek's spelling
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor)


def _yarn_correction_range(dim: int, base: float, rope: dict) -> tuple[float, float]:
    """The band of dimensions between extrapolation (fast) and interpolation (slow)."""
    original = _required(rope, "original_max_position_embeddings")

    def dimension_of(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = dimension_of(float(rope.get("beta_fast") or 32))
    high = dimension_of(float(rope.get("beta_slow") or 1))
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn(dim: int, rope: dict) -> RopeFrequencies:
    base, factor = float(rope["rope_theta"]), _scaling_factor(rope)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    low, high = _yarn_correction_range(dim, base, rope)
    high = high + 0.001 if low == high else high  # no zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # the share of each dimension's extrapolated frequency
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return RopeFrequencies(inv_freq, _yarn_attention_factor(rope, factor))


def _dynamic(dim: int, rope: dict) -> RopeFrequencies:
    """Original frequencies within ``max_position_embeddings``; vLLM's static NTK ones beyond."""
    base, factor = float(rope["rope_theta"]), float(rope["factor"])
    original = int(_required(rope, "max_position_embeddings"))
    length = original * factor
    scaled_base = base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
    return RopeFrequencies(
        _default_inv_freq(dim, base),
        long_inv_freq=_default_inv_freq(dim, scaled_base),
        long_from=original,
    )


def _longrope(dim: int, rope: dict) -> RopeFrequencies:
    """Short factors below ``original_max_position_embeddings``, long factors from it on."""
    base = float(rope["rope_theta"])
    original = int(_required(rope, "original_max_position_embeddings"))
    factor = _scaling_factor(rope)
    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim

    def scaled(key: str) -> torch.Tensor:
        factors = torch.tensor(rope[key], dtype=torch.float32)
        if factors.numel() != dim // 2:
            raise ValueError(f"longrope {key} has {factors.numel()} entries, expected {dim // 2}")
        return 1.0 / (factors * base**shape)

    return RopeFrequencies(
        scaled("short_factor"), float(attention_factor), scaled("long_factor"), original
    )


_FREQUENCIES = {
    "default": _default,
    "linear": _linear,
    "llama3": _llama3,
    "yarn": _yarn,
    "dynamic": _dynamic,
    "longrope": _longrope,
}


def rope_angles(frequencies: RopeFrequencies, max_positions: int) -> torch.Tensor:
    """``[max_positions, rotary_dim // 2]`` float32 angles, each position with its frequencies."""
    positions = torch.arange(max_positions, dtype=torch.int64).float()
    angles = torch.outer(positions, frequencies.inv_freq)
    start = frequencies.long_from
    if frequencies.long_inv_freq is not None and start is not None and start < max_positions:
        angles[start:] = torch.outer(positions[start:], frequencies.long_inv_freq)
    return angles


# --- applying it -----------------------------------------------------------------------------


class RotaryEmbedding:
    """Precomputed cos/sin tables ``[max_positions, rotary_dim]`` (attention factor folded in)."""

    def __init__(self, head_dim: int, max_positions: int, rope: dict, dtype, device) -> None:
        frequencies = rope_frequencies(head_dim, rope)
        angles = rope_angles(frequencies, max_positions)
        emb = torch.cat((angles, angles), dim=-1)
        scale = frequencies.attention_factor
        self.head_dim = head_dim
        self.rotary_dim = frequencies.rotary_dim
        self.attention_factor = scale
        self.cos = (emb.cos() * scale).to(dtype=dtype, device=device)
        self.sin = (emb.sin() * scale).to(dtype=dtype, device=device)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows for the step's positions, shaped to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def for_step(self, positions: torch.Tensor) -> RotaryStep:
        """What every layer of one step needs to rotate its queries and keys."""
        return RotaryStep.over(self.rotary_dim, positions, self.cos, self.sin)


@dataclass
class RotaryStep:
    rotary_dim: int
    positions: torch.Tensor  # [tokens] int64: each token's row of ``cos`` and ``sin``
    cos: torch.Tensor  # [rows, rotary_dim] tables (attention factor folded in)
    sin: torch.Tensor
    ops: object | None  # the native kernels, or None for the torch path
    rows: tuple[torch.Tensor, torch.Tensor] | None  # the torch path's cos/sin rows, once a step

    @classmethod
    def over(
        cls, rotary_dim: int, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> RotaryStep:
        """The step's rotation by the ``positions`` rows of the ``cos``/``sin`` tables."""
        ops = ops_for(cos)
        rows = None
        if ops is None and not cos.is_cuda:
            rows = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        return cls(rotary_dim, positions, cos, sin, ops, rows)

    def apply_(self, qk: torch.Tensor) -> None:
        """Rotate ``qk [tokens, heads, head_dim]`` in place (its first ``rotary_dim`` dims):
        the Triton kernel on GPU, the native one on CPU, else the torch path."""
        if self.rotary_dim < qk.shape[-1]:
            qk = qk[..., : self.rotary_dim]
        if self.ops is not None:
            self.ops.rotary_embedding(self.positions, qk, self.cos, self.sin)
            return
        if self.rows is None and qk.dim() == 3 and qk.stride(-1) == 1:
            from octavo.model_executor.triton_rotary import rotary_triton

            rotary_triton(self.positions, qk, self.cos, self.sin)
            return
        if self.rows is None:
            self.rows = self.cos[self.positions].unsqueeze(1), self.sin[self.positions].unsqueeze(1)
        cos, sin = self.rows
        qk.copy_(apply_rotary(qk, cos, sin))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
