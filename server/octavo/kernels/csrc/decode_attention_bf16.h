// Decode attention's bf16 fast path, for CPUs with AVX512_BF16 (AMD Zen 4 and later, Intel
// Cooper Lake / Sapphire Rapids and later), chosen at run time inside the AVX-512 build.
// vdpbf16ps multiplies pairs of bf16 numbers and adds both products to an fp32 lane:
//   - scores: the query and each key row as stored (no widening), the scale applied to the
//     16 scores of a chunk afterwards;
//   - values: the chunk's softmax weights rounded to bf16 (as torch's CPU flash attention
//     does), two keys at a time, with the two value rows interleaved element by element.
//     unpacklo/hi interleave within 128-bit lanes, so each accumulator holds the head
//     dimensions in a fixed permuted order that `put_rows` puts back.
// The online softmax itself is the fp32 path's (decode_attention.cpp), lane for lane.
#pragma once

#include "bf16_dot.h"

#if defined(__AVX512F__)

#include <cstdint>
#include <cstring>
#include <limits>

#include "bf16_dot.h"
#include "common.h"
#include "vec16.h"

namespace octavo_cpu {

template <typename Shape, int HD, int MaxGroup, int Chunk, bool SoftCap>
struct Bf16Decode {
  static constexpr int kRegs = HD / 32;  // a row of HD bf16 numbers is kRegs zmm registers
  const Shape& s;
  __m512i query[MaxGroup][kRegs];
  __m512 acc[MaxGroup][2 * kRegs];  // [2c]: unpacklo's dimensions of register c; [2c+1]: unpackhi's
  float max[MaxGroup], sum[MaxGroup];
  alignas(64) uint16_t weights[MaxGroup][Chunk];  // bf16 bits

  OCTAVO_BF16_TARGET Bf16Decode(const Shape& shape, const uint16_t* q, const float* sinks) : s(shape) {
    for (int64_t g = 0; g < s.group; ++g) {
      for (int c = 0; c < kRegs; ++c) {
        query[g][c] = _mm512_loadu_si512(q + g * s.q_head_stride + 32 * c);
        acc[g][2 * c] = _mm512_setzero_ps();
        acc[g][2 * c + 1] = _mm512_setzero_ps();
      }
      max[g] = sinks ? sinks[g] : -std::numeric_limits<float>::infinity();
      sum[g] = sinks ? 1.f : 0.f;
    }
  }

  OCTAVO_BF16_TARGET void scores(const uint16_t* keys, int64_t count) {
    vec16 rows[MaxGroup][Chunk];
    for (int64_t t = 0; t < Chunk; ++t) {
      if (t >= count) {
        for (int64_t g = 0; g < s.group; ++g) rows[g][t] = vec16{};
        continue;
      }
      __m512i key[kRegs];
      for (int c = 0; c < kRegs; ++c) key[c] = _mm512_loadu_si512(keys + t * s.slot_stride + 32 * c);
      for (int64_t g = 0; g < s.group; ++g) {
        __m512 partial = _mm512_setzero_ps();
        for (int c = 0; c < kRegs; ++c) {
          partial = _mm512_dpbf16_ps(partial, (__m512bh)query[g][c], (__m512bh)key[c]);
        }
        rows[g][t] = reinterpret_cast<const vec16&>(partial);
      }
    }
    const ivec16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int64_t g = 0; g < s.group; ++g) {
      vec16 score = transpose_add(rows[g]) * s.scale;
      if constexpr (SoftCap) score = tanh16(score * (1.f / s.soft_cap)) * s.soft_cap;
      score = lane < static_cast<int32_t>(count) ? score : splat16(-std::numeric_limits<float>::infinity());
      const float new_max = std::max(max[g], max16(score));
      const vec16 weight = exp16(score - new_max);
      if (new_max != max[g]) {
        const __m512 correction = _mm512_set1_ps(fast_exp(max[g] - new_max));
        for (int c = 0; c < 2 * kRegs; ++c) acc[g][c] = _mm512_mul_ps(acc[g][c], correction);
        sum[g] *= fast_exp(max[g] - new_max);
        max[g] = new_max;
      }
      sum[g] += tree_sum16(weight);
      const __m256bh narrow = _mm512_cvtneps_pbh(reinterpret_cast<const __m512&>(weight));
      std::memcpy(weights[g], &narrow, sizeof(narrow));
    }
  }

  // The chunk's value rows interleaved once, then a query head at a time with its sums in
  // registers (the fp32 path's `values` says why); same order of additions.
  OCTAVO_BF16_TARGET void values(const uint16_t* values, int64_t count) {
    const int64_t pairs = (count + 1) / 2;
    __m512i interleaved[Chunk / 2][2 * kRegs];
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t t = 2 * i;
      for (int c = 0; c < kRegs; ++c) {
        const __m512i first = _mm512_loadu_si512(values + t * s.slot_stride + 32 * c);
        const __m512i second =
            t + 1 < count ? _mm512_loadu_si512(values + (t + 1) * s.slot_stride + 32 * c) : _mm512_setzero_si512();
        interleaved[i][2 * c] = _mm512_unpacklo_epi16(first, second);
        interleaved[i][2 * c + 1] = _mm512_unpackhi_epi16(first, second);
      }
    }
    for (int64_t g = 0; g < s.group; ++g) {
      __m512 sums[2 * kRegs];
      for (int j = 0; j < 2 * kRegs; ++j) sums[j] = acc[g][j];
      for (int64_t i = 0; i < pairs; ++i) {
        int32_t pair;
        std::memcpy(&pair, &weights[g][2 * i], sizeof(pair));
        const __m512bh weight = (__m512bh)_mm512_set1_epi32(pair);
        for (int j = 0; j < 2 * kRegs; ++j) sums[j] = _mm512_dpbf16_ps(sums[j], weight, (__m512bh)interleaved[i][j]);
      }
      for (int j = 0; j < 2 * kRegs; ++j) acc[g][j] = sums[j];
    }
  }

  // Register c's 128-bit lane k holds dimensions 32c + 8k + 0..3 (unpacklo) and + 4..7
  // (unpackhi): query head g's row times `scale(g)`, head dimensions put back in order into
  // `out`.
  template <typename Out, typename Scale>
  OCTAVO_BF16_TARGET void put_rows(Out* out, Scale scale) const {
    for (int64_t g = 0; g < s.group; ++g) {
      const __m512 factor = _mm512_set1_ps(scale(g));
      for (int c = 0; c < kRegs; ++c) {
        alignas(64) float low[16], high[16];
        _mm512_store_ps(low, _mm512_mul_ps(acc[g][2 * c], factor));
        _mm512_store_ps(high, _mm512_mul_ps(acc[g][2 * c + 1], factor));
        for (int k = 0; k < 4; ++k) {
          for (int j = 0; j < 4; ++j) {
            out[g * HD + 32 * c + 8 * k + j] = from_float<Out>(low[4 * k + j]);
            out[g * HD + 32 * c + 8 * k + 4 + j] = from_float<Out>(high[4 * k + j]);
          }
        }
      }
    }
  }
};

}  // namespace octavo_cpu
#endif  // __AVX512F__
