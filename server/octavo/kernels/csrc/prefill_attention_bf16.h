// Paged prefill attention's bf16 tile, for bf16 queries over a bf16 cache on CPUs with
// AVX512_BF16 (see bf16_dot.h). The same task and lane-wise softmax as the fp32 tile
// (prefill_attention.h), with vdpbf16ps for both products:
//   - scores: each row's query as pairs of dimensions (lanes = rows) against a key's pair
//     broadcast straight from the cache (no widening, no copy); the scale multiplies the
//     16 scores of a key afterwards;
//   - values: the weights of keys t and t + 1 rounded to bf16 (as torch's CPU flash
//     attention rounds them) and paired per row, against the two value rows interleaved
//     element by element. unpacklo/hi interleave within 128-bit lanes, so the output
//     accumulators hold the head dimensions in the order `dim_of` gives, put back at the end.
#pragma once

#include "bf16_dot.h"
#include "prefill_attention.h"

#if defined(__AVX512F__)
#include <cstdint>
#include <cstring>

namespace octavo_cpu {
namespace prefill {

// Storage position -> head dimension: register c of 32 dimensions, unpacklo (h = 0) or
// unpackhi (h = 1), 32-bit element 4k + j.
constexpr int64_t dim_of(int64_t position) {
  const int64_t c = position / 32, h = position / 16 % 2, k = position % 16 / 4, j = position % 4;
  return 32 * c + 8 * k + 4 * h + j;
}

inline int32_t load_pair(const uint16_t* src) {
  int32_t pair;
  std::memcpy(&pair, src, sizeof(pair));
  return pair;
}

// Two keys' weights for the 16 rows (fp32 lanes) as one register of bf16 pairs: row r's
// (even[r], odd[r]) in 32-bit element r, rounded as torch's CPU flash attention rounds them.
OCTAVO_BF16_TARGET inline __m512i weight_pairs(const vec16& even, const vec16& odd) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                               6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512bh both =
      _mm512_cvtne2ps_pbh(reinterpret_cast<const __m512&>(odd), reinterpret_cast<const __m512&>(even));
  return _mm512_permutexvar_epi16(interleave, (__m512i)both);
}

template <int HD>
struct Bf16PrefillTile {
  static constexpr int64_t kTaskRows = kRows;

  alignas(64) uint32_t query[HD / 2][kRows];    // pair p of each row: dimensions 2p (low half), 2p + 1
  alignas(64) float out[HD][kRows];             // transposed accumulators, in dim_of order
  alignas(64) uint32_t values[kKeys / 2][HD];  // value pairs (t, t + 1) of each dimension, in dim_of order
  alignas(64) uint16_t zeros[HD] = {};          // stands in for the rows past a chunk's keys
  SoftmaxLanes lanes;

  OCTAVO_BF16_TARGET void start(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task,
                                const uint16_t* query_base) {
    for (int64_t lane = 0; lane < kRows; ++lane) {
      const TileRow row = tile_row(s, seq, task, lane);
      const uint16_t* q = query_base + row.token * s.q_token_stride + row.head * s.q_head_stride;
      for (int64_t p = 0; p < HD / 2; ++p) query[p][lane] = row.valid ? static_cast<uint32_t>(load_pair(q + 2 * p)) : 0u;
      for (int64_t d = 0; d < HD; ++d) out[d][lane] = 0.f;
    }
    lanes.start(s, seq, task);
  }

  OCTAVO_BF16_TARGET void scores(const uint16_t* const* rows, int64_t count, float scale) {
    for (int64_t t0 = 0; t0 < count; t0 += kBlock) {
      __m512 acc[kBlock];
      for (int64_t j = 0; j < kBlock; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t p = 0; p < HD / 2; ++p) {
        const __m512bh q = (__m512bh)_mm512_load_si512(query[p]);
#pragma GCC unroll 8
        for (int64_t j = 0; j < kBlock; ++j) {
          const __m512bh k = (__m512bh)_mm512_set1_epi32(load_pair(rows[t0 + j] + 2 * p));
          acc[j] = _mm512_dpbf16_ps(acc[j], q, k);
        }
      }
      for (int64_t j = 0; j < kBlock; ++j) {
        lanes.probs[t0 + j] = reinterpret_cast<const vec16&>(acc[j]) * scale;
      }
    }
  }

  OCTAVO_BF16_TARGET void pack_values(const uint16_t* const* rows, int64_t count) {
    for (int64_t t = 0; t < count; t += 2) {
      for (int64_t c = 0; c < HD / 32; ++c) {
        const __m512i first = _mm512_loadu_si512(rows[t] + 32 * c);
        const __m512i second = _mm512_loadu_si512(rows[t + 1] + 32 * c);
        _mm512_store_si512(values[t / 2] + 32 * c, _mm512_unpacklo_epi16(first, second));
        _mm512_store_si512(values[t / 2] + 32 * c + 16, _mm512_unpackhi_epi16(first, second));
      }
    }
  }

  OCTAVO_BF16_TARGET void accumulate(int64_t count, vec16 correction) {
    const int64_t pairs = (count + 1) / 2;
    __m512bh weights[kKeys / 2];
    for (int64_t i = 0; i < pairs; ++i) {  // lanes.probs past `count` are 0
      weights[i] = (__m512bh)weight_pairs(lanes.probs[2 * i], lanes.probs[2 * i + 1]);
    }
    const __m512 scale = reinterpret_cast<const __m512&>(correction);
    for (int64_t p0 = 0; p0 < HD; p0 += kBlock) {
      __m512 acc[kBlock];
      for (int64_t j = 0; j < kBlock; ++j) acc[j] = _mm512_mul_ps(_mm512_load_ps(out[p0 + j]), scale);
      for (int64_t i = 0; i < pairs; ++i) {
#pragma GCC unroll 8
        for (int64_t j = 0; j < kBlock; ++j) {
          const __m512bh v = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(values[i][p0 + j]));
          acc[j] = _mm512_dpbf16_ps(acc[j], weights[i], v);
        }
      }
      for (int64_t j = 0; j < kBlock; ++j) _mm512_store_ps(out[p0 + j], acc[j]);
    }
  }

  // Row pointers of the chunk's keys (or values) in the cache; `zeros` past `count`.
  void chunk_rows(const uint16_t** rows, const uint16_t* base, const int64_t* offsets, int64_t count) const {
    for (int64_t t = 0; t < kKeys; ++t) rows[t] = t < count ? base + offsets[t] : zeros;
  }

  OCTAVO_BF16_TARGET void chunk(const PrefillShape& s, const PrefillSeq& seq, const uint16_t* key_base,
                                const uint16_t* value_base, int64_t key, int64_t count, bool masked) {
    int64_t offsets[kKeys];
    chunk_offsets(s, seq.table, key, count, offsets);
    const uint16_t* rows[kKeys];
    chunk_rows(rows, key_base, offsets, count);
    scores(rows, count, s.scale);
    const vec16 correction = lanes.weigh(s, key, count, masked);
    chunk_rows(rows, value_base, offsets, count);
    pack_values(rows, count);
    accumulate(count, correction);
  }

  void finish(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, uint16_t* out_base) const {
    const auto row_of = [this](int64_t lane, float* buffer) -> const float* {
      for (int64_t p = 0; p < HD; ++p) buffer[dim_of(p)] = out[p][lane];
      return buffer;
    };
    write_rows<HD>(lanes, s, seq, task, out_base, row_of);
  }
};

}  // namespace prefill
}  // namespace octavo_cpu
#endif  // __AVX512F__
