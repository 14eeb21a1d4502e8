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
