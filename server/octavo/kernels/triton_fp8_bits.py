"""FP8 bytes and half-precision values in Triton, with integer bit operations only.

The same rounding as torch's conversions on every GPU and under the interpreter (whose own
fp8 casts round wrongly), and no fp8 instructions: GPUs before sm_89 (A100, A10, T4) have
none, and Triton refuses to compile an e4m3 tensor for them. Used for the fp8 KV cache
(``attention/triton_kernels.py``) and the fp8 weights of the quantized linears.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NOT_FP8, E4M3, E5M2 = 0, 1, 2  # the FP8 constexpr of the kernels
FP8_FORMATS = {torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}
FP8_HALF_FACTOR = {NOT_FP8: 1.0, E4M3: 256.0, E5M2: 1.0}  # value = widened fp16 * factor
# The same two for the kernels that read e4m3 weights (constexpr: globals a kernel reads).
E4M3_CODE = tl.constexpr(E4M3)
E4M3_HALF_FACTOR = tl.constexpr(FP8_HALF_FACTOR[E4M3])


@triton.jit
def fp8_encode(x, FP8: tl.constexpr):
    """fp32 -> fp8 bytes: saturated, rounded to nearest even (torch's conversion)."""
    MANT: tl.constexpr = 3 if FP8 == 1 else 2
    BIAS: tl.constexpr = 7 if FP8 == 1 else 15
    LIMIT: tl.constexpr = 448.0 if FP8 == 1 else 57344.0
    bits = tl.minimum(tl.abs(x), LIMIT).to(tl.uint32, bitcast=True)
    shift: tl.constexpr = 23 - MANT
    odd = (bits >> shift) & 1
    normal = ((bits + ((1 << (shift - 1)) - 1) + odd) >> shift) - ((127 - BIAS) << MANT)
    exponent = (bits >> 23).to(tl.int32)
    sub_shift = tl.minimum(tl.maximum((151 - BIAS - MANT) - exponent, 0), 31).to(tl.uint32)
    mantissa = (bits & 0x7FFFFF) | 0x800000
    half = (tl.full(bits.shape, 1, tl.uint32) << sub_shift) >> 1
    sub_odd = (mantissa >> sub_shift) & 1
    subnormal = (mantissa + half - 1 + sub_odd) >> sub_shift
    code = tl.where(exponent < 127 - BIAS + 1, subnormal, normal)
    sign = (x.to(tl.uint32, bitcast=True) >> 24) & 0x80
    return (code | sign).to(tl.uint8)


@triton.jit
def fp8_to_half(raw, FP8: tl.constexpr):
    """fp8 bytes -> fp16 exactly: E5M2 is fp16's top byte; E4M3 lands as ``value / 256``."""
    wide = raw.to(tl.uint16)
    if FP8 == 1:
        return (((wide & 0x7F) << 7) | ((wide & 0x80) << 8)).to(tl.float16, bitcast=True)
    return (wide << 8).to(tl.float16, bitcast=True)
