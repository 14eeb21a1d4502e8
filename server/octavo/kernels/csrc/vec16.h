// 16 floats as one GCC vector: one AVX-512 register, or two AVX2 registers, from the same
// source. Loads widen bfloat16 bits to fp32; `transpose_add` turns 16 vectors into the
// vector of their 16 horizontal sums with 15 shuffle+add steps (no scalar reductions).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common.h"

namespace octavo_cpu {

typedef float vec16 __attribute__((vector_size(64)));
typedef int32_t ivec16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

inline vec16 load16(const float* src) {
  vec16 out;
  std::memcpy(&out, src, sizeof(out));
  return out;
}

inline vec16 load16(const uint16_t* src) {  // bfloat16 bits
  u16x16 raw;
  std::memcpy(&raw, src, sizeof(raw));
  const u32x16 wide = __builtin_convertvector(raw, u32x16) << 16;
  return reinterpret_cast<const vec16&>(wide);
}

typedef uint8_t u8x16 __attribute__((vector_size(16)));

// fp8 bits widened exactly (common.h's fp8_to_float, 16 lanes at once).
template <int MantissaBits, int Bias>
inline vec16 load16_fp8(const uint8_t* src) {
  u8x16 raw;
  std::memcpy(&raw, src, sizeof(raw));
  const u32x16 bits = __builtin_convertvector(raw, u32x16);
  const u32x16 magnitude = bits & 0x7Fu;
  const ivec16 as_int = reinterpret_cast<const ivec16&>(magnitude);
  const vec16 subnormal = __builtin_convertvector(as_int, vec16) * (1.f / static_cast<float>(1u << (Bias + MantissaBits - 1)));
  const u32x16 normal = (magnitude << (23 - MantissaBits)) + (static_cast<uint32_t>(127 - Bias) << 23);
  u32x16 value = magnitude < (1u << MantissaBits) ? reinterpret_cast<const u32x16&>(subnormal) : normal;
  value |= (bits & 0x80u) << 24;
  return reinterpret_cast<const vec16&>(value);
}

inline vec16 load16(const fp8_e4m3* src) { return load16_fp8<3, 7>(&src->bits); }
inline vec16 load16(const fp8_e5m2* src) { return load16_fp8<2, 15>(&src->bits); }

inline void store16(float* dst, vec16 value) { std::memcpy(dst, &value, sizeof(value)); }

// 16 copies of `value`, built as such: `vec16{} + value` must compute 0 + value (it turns
// -0 into +0), so GCC emits a scalar add before every broadcast, and on narrower ISAs it
// lowers it into 16 scalar stores through the stack.
inline vec16 splat16(float value) {
  return vec16{value, value, value, value, value, value, value, value,
               value, value, value, value, value, value, value, value};
}

// exp_vector's steps that AVX-512 and AVX2 have instructions for: the clamps (min/max;
// NaN stays), the floor (vrndscaleps, vroundps) and the 2^n scaling (vscalefps). Measured
// on a Zen 5 core in a loop like the prefill tile's weighing: 10 cycles a vector with
// them, 18 with the generic steps; the same values.
template <typename V, typename Splat>
inline V clamp_exp_input(V x, Splat splat) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == sizeof(__m512)) {
    const __m512 low = _mm512_max_ps(_mm512_set1_ps(-87.3f), reinterpret_cast<const __m512&>(x));
    const __m512 clamped = _mm512_min_ps(_mm512_set1_ps(88.7f), low);
    return reinterpret_cast<const V&>(clamped);
  }
#elif defined(__AVX2__)
  if constexpr (sizeof(V) == sizeof(__m256)) {
    const __m256 low = _mm256_max_ps(_mm256_set1_ps(-87.3f), reinterpret_cast<const __m256&>(x));
    const __m256 clamped = _mm256_min_ps(_mm256_set1_ps(88.7f), low);
    return reinterpret_cast<const V&>(clamped);
  }
#endif
  x = x < -87.3f ? splat(-87.3f) : x;
  return x > 88.7f ? splat(88.7f) : x;
}

template <typename V, typename IV>
inline V floor_vector(V y) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == sizeof(__m512)) {
    const __m512 floor = _mm512_roundscale_ps(reinterpret_cast<const __m512&>(y), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return reinterpret_cast<const V&>(floor);
  }
#elif defined(__AVX2__)
  if constexpr (sizeof(V) == sizeof(__m256)) {
    const __m256 floor = _mm256_round_ps(reinterpret_cast<const __m256&>(y), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return reinterpret_cast<const V&>(floor);
  }
#endif
  IV whole = __builtin_convertvector(y, IV);      // toward zero; then down to floor
  whole += __builtin_convertvector(whole, V) > y;  // a true comparison is -1
  return __builtin_convertvector(whole, V);
}

// p * 2^n for whole numbers n in [-126, 128].
template <typename V, typename IV>
inline V scale_by_pow2(V p, V n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == sizeof(__m512)) {
    const __m512 scaled = _mm512_scalef_ps(reinterpret_cast<const __m512&>(p), reinterpret_cast<const __m512&>(n));
    return reinterpret_cast<const V&>(scaled);
  }
#endif
  const IV scale = (__builtin_convertvector(n, IV) + 127) << 23;  // exact: n is whole
  return p * reinterpret_cast<const V&>(scale);
}

// a * b + c, rounded once where the ISA has FMA at V's width (the kernels are built with
// -ffp-contract=off, so `a * b + c` stays two instructions).
template <typename V>
inline V multiply_add(V a, V b, V c) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == sizeof(__m512)) {
    const __m512 r = _mm512_fmadd_ps(reinterpret_cast<const __m512&>(a), reinterpret_cast<const __m512&>(b),
                                     reinterpret_cast<const __m512&>(c));
    return reinterpret_cast<const V&>(r);
  }
#endif
#if defined(__FMA__)
  if constexpr (sizeof(V) == sizeof(__m256)) {
    const __m256 r = _mm256_fmadd_ps(reinterpret_cast<const __m256&>(a), reinterpret_cast<const __m256&>(b),
                                     reinterpret_cast<const __m256&>(c));
    return reinterpret_cast<const V&>(r);
  }
#endif
  return a * b + c;
}

// exp_polynomial (common.h) with a multiply-add a step: 7 instructions instead of 14 in
// the weighing of the attention kernels, where exp is most of the vector work.
template <typename V, typename Splat>
inline V exp_polynomial_fused(V r, Splat splat) {
  V p = splat(kExpPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = multiply_add(p, r, splat(kExpPolynomial[i]));
  return multiply_add(p, r * r, r + 1.f);
}

// fast_exp (common.h) lane by lane, written with vector operations: V a GCC float vector,
// IV the int32 vector of its width, `splat` its broadcast. The steps are fused multiply-adds
// where the ISA has them, so a lane may differ from fast_exp in its last bit.
template <typename V, typename IV, typename Splat>
inline V exp_vector(V x, Splat splat) {
  x = clamp_exp_input(x, splat);
  const V n = floor_vector<V, IV>(multiply_add(x, splat(1.44269504088896341f), splat(0.5f)));
  const V r = multiply_add(n, splat(2.12194440e-4f), multiply_add(n, splat(-0.693359375f), x));
  return scale_by_pow2<V, IV>(exp_polynomial_fused(r, splat), n);
}

inline vec16 exp16(vec16 x) { return exp_vector<vec16, ivec16>(x, splat16); }

// tanh lane by lane: an odd Taylor polynomial near 0 (where 1 - e^-2|x| cancels), else
// (1 - e^-2|x|) / (1 + e^-2|x|), with the sign put back.
inline vec16 tanh16(vec16 x) {
  const vec16 a = x < 0.f ? -x : x;
  const vec16 e = exp16(a * -2.f);
  const vec16 large = (1.f - e) / (1.f + e);
  const vec16 a2 = a * a;
  const vec16 small =
      a * (1.f + a2 * (-1.f / 3.f + a2 * (2.f / 15.f + a2 * (-17.f / 315.f + a2 * (62.f / 2835.f)))));
  const vec16 magnitude = a < 0.3f ? small : large;
  return x < 0.f ? -magnitude : magnitude;
}

#if defined(__AVX512F__)
inline float max16(vec16 x) { return _mm512_reduce_max_ps(reinterpret_cast<const __m512&>(x)); }

// The lanes' sum as a tree (its own order: not sum16's left-to-right one).
inline float tree_sum16(vec16 x) { return _mm512_reduce_add_ps(reinterpret_cast<const __m512&>(x)); }
#else
inline float max16(vec16 x) {
  float best = x[0];
  for (int i = 1; i < 16; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

// The lanes' sum as a tree (its own order: not sum16's left-to-right one).
inline float tree_sum16(vec16 x) {
  float lanes[16];
  store16(lanes, x);
  return add_lanes(lanes);
}
#endif

inline float sum16(vec16 x) {
  float total = 0.f;
  for (int i = 0; i < 16; ++i) total += x[i];
  return total;
}

// Pairs up (a, b): lanes of `a` and `b` selected by the two masks, added.
inline vec16 fold(vec16 a, vec16 b, ivec16 low, ivec16 high) {
  return __builtin_shuffle(a, b, low) + __builtin_shuffle(a, b, high);
}

// out[t] = sum over lanes of rows[t], for 16 rows (the AVX-512 build's decode; narrower
// builds sum rows at their native width, decode_attention_narrow.h's `row_sums`).
inline vec16 transpose_add(const vec16* rows) {
  const ivec16 l1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const ivec16 h1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const ivec16 l2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const ivec16 h2 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  const ivec16 l3 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const ivec16 h3 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  const ivec16 l4 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const ivec16 h4 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  vec16 pairs[8], quads[4], octs[2];
  for (int i = 0; i < 8; ++i) pairs[i] = fold(rows[2 * i], rows[2 * i + 1], l1, h1);
  for (int i = 0; i < 4; ++i) quads[i] = fold(pairs[2 * i], pairs[2 * i + 1], l2, h2);
  for (int i = 0; i < 2; ++i) octs[i] = fold(quads[2 * i], quads[2 * i + 1], l3, h3);
  return fold(octs[0], octs[1], l4, h4);
}

}  // namespace octavo_cpu
