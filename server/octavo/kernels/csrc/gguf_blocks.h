// GGUF's 5-bit blocks (Q5_0, Q5_1: 32 columns) and K-quant super-blocks (Q4_K, Q5_K,
// Q6_K: 256 columns), decoded into what the block kernels of quantized_linear.cpp use:
// 32-column sub-blocks of small integers q with w = d * q + m, d per 16 columns (Q6_K has
// two per sub-block, the others one) and m per 32 columns. Layouts are llama.cpp's
// (ggml-common.h), byte for byte; the dequantized values equal gguf.quants.dequantize's:
// every product below is exact in float32 (an fp16 scale times integers of at most 13 bits
// together), so the only rounding is the one addition it also does.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace octavo_cpu::gguf_blocks {

constexpr int64_t kSubBlocks = 8;  // 32-column sub-blocks in a 256-column super-block

// Per super-block: d per 16 columns, m per 32 columns (w = d * q + m).
struct SuperScales {
  float d[2 * kSubBlocks];
  float m[kSubBlocks];
};

inline float fp16(const uint8_t* src) {
  uint16_t h;
  std::memcpy(&h, src, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  if (exponent == 0) {  // zero or subnormal
    const float value = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -value : value;
  }
  const uint32_t bits = exponent == 31 ? sign | 0x7F800000u | (mantissa << 13)
                                       : sign | ((exponent + 112) << 23) | (mantissa << 13);
  return std::bit_cast<float>(bits);
#endif
}

// Q4_K/Q5_K's 12 bytes of 6-bit scales and mins: the first four of each in the low 6 bits
// of bytes 0-3 (scales) and 4-7 (mins); the last four split over bytes 8-11 (low 4 bits)
// and the top 2 bits of bytes 0-7.
inline void scale_and_min(const uint8_t* packed, int64_t j, int& scale, int& min) {
  if (j < 4) {
    scale = packed[j] & 63;
    min = packed[j + 4] & 63;
  } else {
    scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
    min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Q4_K: d, dmin (fp16), 12 bytes of scales/mins, 128 bytes of nibbles (144).
// Q5_K: the same with 32 bytes of fifth bits before the nibbles (176).
// Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d (fp16) (210).
template <bool six_bit>
inline void decode_scales(const uint8_t* block, SuperScales& out) {
  if constexpr (six_bit) {
    const float d = fp16(block + 208);
    for (int64_t i = 0; i < 2 * kSubBlocks; ++i) {
      out.d[i] = d * static_cast<float>(static_cast<int8_t>(block[192 + i]));
    }
    for (int64_t j = 0; j < kSubBlocks; ++j) out.m[j] = 0.f;
    return;
  }
  const float d = fp16(block), dmin = fp16(block + 2);
  for (int64_t j = 0; j < kSubBlocks; ++j) {
    int scale, min;
    scale_and_min(block + 4, j, scale, min);
    out.d[2 * j] = out.d[2 * j + 1] = d * static_cast<float>(scale);
    out.m[j] = -(dmin * static_cast<float>(min));
  }
}

// Sub-block j's 32 integers (Q4_K, Q5_K: 0..31 unsigned; Q6_K: -32..31).
inline void q4k_values(const uint8_t* block, int64_t j, int32_t* out) {
  const uint8_t* qs = block + 16 + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int64_t l = 0; l < 32; ++l) out[l] = (qs[l] >> shift) & 0x0F;
}

inline void q5k_values(const uint8_t* block, int64_t j, int32_t* out) {
  const uint8_t *qh = block + 16, *qs = block + 48 + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int64_t l = 0; l < 32; ++l) out[l] = ((qs[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
}

inline void q6k_values(const uint8_t* block, int64_t j, int32_t* out) {
  const int64_t half = j / 4, group = j % 4;
  const uint8_t *ql = block + 64 * half + 32 * (group % 2), *qh = block + 128 + 32 * half;
  const int low_shift = 4 * (group / 2), high_shift = 2 * static_cast<int>(group);
  for (int64_t l = 0; l < 32; ++l) {
    out[l] = (((ql[l] >> low_shift) & 0x0F) | (((qh[l] >> high_shift) & 3) << 4)) - 32;
  }
}

// Q5_0/Q5_1: column c's fifth bit is bit c of a little-endian uint32.
inline uint32_t fifth_bits(const uint8_t* src) {
  uint32_t bits;
  std::memcpy(&bits, src, 4);
  return bits;
}

#if defined(__AVX2__)
inline __m256i shifted_right(__m256i v, int bits) {
  return _mm256_srl_epi16(v, _mm_cvtsi32_si128(bits));
}

inline __m256i load32(const uint8_t* src) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
}

// Byte c = 0x10 where bit c of `bits` is set, else 0.
inline __m256i fifth_bit_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

inline __m256i q4k_integers(const uint8_t* block, int64_t j) {
  const __m256i qs = shifted_right(load32(block + 16 + 32 * (j / 2)), 4 * (j % 2));
  return _mm256_and_si256(qs, _mm256_set1_epi8(0x0F));
}

inline __m256i q5k_integers(const uint8_t* block, int64_t j) {
  const __m256i low = _mm256_and_si256(shifted_right(load32(block + 48 + 32 * (j / 2)), 4 * (j % 2)),
                                       _mm256_set1_epi8(0x0F));
  const __m256i high = _mm256_and_si256(shifted_right(load32(block + 16), static_cast<int>(j)),
                                        _mm256_set1_epi8(0x01));
  return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
}

inline __m256i q6k_integers(const uint8_t* block, int64_t j) {
  const int64_t half = j / 4, group = j % 4;
  const __m256i low = _mm256_and_si256(
      shifted_right(load32(block + 64 * half + 32 * (group % 2)), 4 * static_cast<int>(group / 2)),
      _mm256_set1_epi8(0x0F));
  const __m256i high = _mm256_and_si256(
      shifted_right(load32(block + 128 + 32 * half), 2 * static_cast<int>(group)), _mm256_set1_epi8(0x03));
  const __m256i q = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
  return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
}
#endif

}  // namespace octavo_cpu::gguf_blocks
