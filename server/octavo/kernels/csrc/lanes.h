// Vectors of the native register width (AVX-512: 16 floats, AVX2: 8, plain x86-64: 4).
// A vec16 is two ymm on AVX2 (four xmm on plain x86-64), and GCC keeps arrays of vec16 on
// the stack there, moving every lane through general registers (measured: prefill
// attention written with vec16 accumulators ran 5x slower on the AVX2 build than the same
// code at this width); loops over such arrays use these instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common.h"
#include "vec16.h"

namespace octavo_cpu {

#if defined(__AVX512F__)
constexpr int64_t kWidth = 16;
#elif defined(__AVX2__)
constexpr int64_t kWidth = 8;
#else
constexpr int64_t kWidth = 4;
#endif
typedef float lanes_t __attribute__((vector_size(kWidth * sizeof(float))));

inline lanes_t load_lanes(const float* src) {
  lanes_t out;
  std::memcpy(&out, src, sizeof(out));
  return out;
}

inline void store_lanes(float* dst, lanes_t value) { std::memcpy(dst, &value, sizeof(value)); }

template <std::size_t... Lane>
inline lanes_t splat_lanes(float value, std::index_sequence<Lane...>) {
  return lanes_t{((void)Lane, value)...};
}

// kWidth copies of `value` (see splat16: never `lanes_t{} + value`).
inline lanes_t splat_lanes(float value) { return splat_lanes(value, std::make_index_sequence<kWidth>{}); }

typedef int32_t ilanes_t __attribute__((vector_size(kWidth * sizeof(int32_t))));

inline ilanes_t load_ilanes(const int32_t* src) {
  ilanes_t out;
  std::memcpy(&out, src, sizeof(out));
  return out;
}

#if defined(__AVX512F__)
// columns[j] = the 32-bit elements rows[i][col + j] for i < 16: a 16 x 16 block turned in
// registers with 64 shuffles, moves only (any bits, floats or not, come through as they
// were). Its 16 row loads are independent, so their cache misses overlap.
inline void transpose_16x16(const float* const* rows, int64_t col, __m512 columns[16]) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows[i] + col);
  for (int k = 0; k < 8; ++k) {  // t[2k], t[2k + 1]: rows 2k, 2k + 1 interleaved
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // r[4k + c], 128-bit part p: rows 4k.. of column 4p + c
    const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * k + 1]), d = _mm512_castps_pd(t[4 * k + 3]);
    r[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    r[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  for (int c = 0; c < 4; ++c) {  // column 4p + c gathers part p of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512 even_low = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), odd_low = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
    const __m512 even_high = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 odd_high = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    columns[c] = _mm512_shuffle_f32x4(even_low, even_high, 0x88);
    columns[4 + c] = _mm512_shuffle_f32x4(odd_low, odd_high, 0x88);
    columns[8 + c] = _mm512_shuffle_f32x4(even_low, even_high, 0xdd);
    columns[12 + c] = _mm512_shuffle_f32x4(odd_low, odd_high, 0xdd);
  }
}
#endif

// dst[j * stride + i] = rows[i][col + j] * scale for i, j < kWidth: a square block turned
// in registers (AVX-512: transpose_16x16; AVX2: 24 shuffles for 8 x 8); element by
// element, the same transposition of a prefill tile's queries cost 5-7 % of the tile.
inline void transpose_lanes(const float* const* rows, int64_t col, float* dst, int64_t stride, float scale) {
#if defined(__AVX512F__)
  __m512 columns[16];
  transpose_16x16(rows, col, columns);
  const __m512 factor = _mm512_set1_ps(scale);
  for (int j = 0; j < 16; ++j) _mm512_storeu_ps(dst + j * stride, columns[j] * factor);
#elif defined(__AVX2__)
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i] + col);
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 2; ++k) {  // r[4k + c], 128-bit half p: rows 4k.. of column 4p + c
    const __m256d a = _mm256_castps_pd(t[4 * k]), b = _mm256_castps_pd(t[4 * k + 2]);
    const __m256d c = _mm256_castps_pd(t[4 * k + 1]), d = _mm256_castps_pd(t[4 * k + 3]);
    r[4 * k] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, b));
    r[4 * k + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, b));
    r[4 * k + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(c, d));
    r[4 * k + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(c, d));
  }
  const __m256 factor = _mm256_set1_ps(scale);
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * stride, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20) * factor);
    _mm256_storeu_ps(dst + (4 + c) * stride, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31) * factor);
  }
#else
  for (int64_t i = 0; i < kWidth; ++i) {
    for (int64_t j = 0; j < kWidth; ++j) dst[j * stride + i] = rows[i][col + j] * scale;
  }
#endif
}

// exp16 (vec16.h) at the native width.
inline lanes_t exp_lanes(lanes_t x) {
  return exp_vector<lanes_t, ilanes_t>(x, [](float value) { return splat_lanes(value); });
}

inline float* lane_data(vec16& value) { return reinterpret_cast<float*>(&value); }
inline const float* lane_data(const vec16& value) { return reinterpret_cast<const float*>(&value); }

// kWidth elements of a cache row, widened to fp32.
inline lanes_t load_lanes(const bf16_bits* src) {
  typedef uint16_t u16_lanes __attribute__((vector_size(kWidth * sizeof(uint16_t))));
  typedef uint32_t u32_lanes __attribute__((vector_size(kWidth * sizeof(uint32_t))));
  u16_lanes raw;
  std::memcpy(&raw, src, sizeof(raw));
  const u32_lanes wide = __builtin_convertvector(raw, u32_lanes) << 16;
  return reinterpret_cast<const lanes_t&>(wide);
}

template <typename C>
inline lanes_t load_lanes(const C* src) {  // fp8: exact widening, element by element
  lanes_t out;
  for (int64_t i = 0; i < kWidth; ++i) out[i] = to_float(src[i]);
  return out;
}

// Lane by lane, the larger of a and b (max_lanes below reduces one vector to its largest).
inline lanes_t larger_lanes(lanes_t a, lanes_t b) { return a > b ? a : b; }

inline float max_lanes(lanes_t x) {
  float best = x[0];
  for (int64_t i = 1; i < kWidth; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

inline float sum_lanes(lanes_t x) {
  float total = x[0];
  for (int64_t i = 1; i < kWidth; ++i) total += x[i];
  return total;
}

}  // namespace octavo_cpu
