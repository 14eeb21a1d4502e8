"""An 8-bit float KV cache (``--kv-cache-dtype fp8``): its element types, per-tensor scales
and the reference conversions every backend matches.

A stored key is ``fp8(clamp(key / k_scale))`` and attention reads it back as
``float(stored) * k_scale`` (values alike with ``v_scale``). Scales are per layer and fixed
for the life of the cache: blocks written under one scale are shared by prefix caching and
copy-on-write, so a scale that changed later would misread them. Conversions round to
nearest even and saturate at the format's largest finite value (an outlier never becomes
inf/NaN). Attention always reads the stored (rounded) keys and values, prefill included, so
a prompt's output does not depend on whether its prefix came from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPES = {
    "fp8": torch.float8_e4m3fn,  # vLLM's ``fp8`` is E4M3
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class KVScales:
    """One layer's per-tensor scales: stored = value / scale (1.0 unless a checkpoint gives
    calibrated ``k_scale`` / ``v_scale``)."""

    k: float = 1.0
    v: float = 1.0

    def __post_init__(self) -> None:
        for name, scale in (("k_scale", self.k), ("v_scale", self.v)):
            if not (scale > 0 and scale != float("inf")):
                raise ValueError(f"{name} must be a positive finite number, got {scale!r}")


UNIT_SCALES = KVScales()


def kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for ``--kv-cache-dtype`` (``auto``: the model's dtype)."""
    if name == "auto":
        return model_dtype
    if name not in FP8_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be auto or one of {sorted(FP8_DTYPES)}, got {name!r}"
        )
    return FP8_DTYPES[name]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of the fp8 type (448 for E4M3, 57344 for E5M2)."""
    return float(torch.finfo(dtype).max)


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``fp8(clamp(x / scale))``: fp32 product with the fp32 reciprocal, round to nearest
    even, saturated. The native and Triton kernels compute exactly this."""
    limit = fp8_max(dtype)
    scaled = x.float() if scale == 1.0 else x.float() * (1.0 / scale)
    return scaled.clamp(-limit, limit).to(dtype)


def stored(x: torch.Tensor, scale: float, cache_dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a cache of ``cache_dtype`` holds it, in ``x``'s dtype and not yet multiplied
    by its scale (attention folds the scales into the softmax scale and the output)."""
    if not is_fp8(cache_dtype):
        return x
    return quantize(x, scale, cache_dtype).to(x.dtype)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Stored fp8 values as attention reads them: times their scale, in ``dtype``."""
    return x.to(dtype) * scale
