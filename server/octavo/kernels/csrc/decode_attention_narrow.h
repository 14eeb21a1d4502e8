// Decode attention's chunked path for the AVX2 and plain x86-64 builds: the same
// arithmetic as ChunkedDecode (decode_attention.cpp, the AVX-512 build's), written with
// vectors of the native width (lanes.h) instead of vec16, whose arrays GCC keeps on the
// stack there (the AVX2 build ran 2.4x slower than the AVX-512 build on the same Zen 4,
// which runs both widths at the same FLOP rate). Each query head's 16 scores of a chunk
// come out of one fold tree of native shuffles (`row_sums`).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common.h"
#include "lanes.h"

#if !defined(__AVX512F__)
namespace octavo_cpu {

// out[t] = the sum of rows[t]'s lanes, for 16 rows.
inline void row_sums(const lanes_t* rows, float* out) {
#if defined(__AVX2__)
  static_assert(kWidth == 8);
  const ilanes_t l1 = {0, 1, 2, 3, 8, 9, 10, 11}, h1 = {4, 5, 6, 7, 12, 13, 14, 15};
  const ilanes_t l2 = {0, 1, 4, 5, 8, 9, 12, 13}, h2 = {2, 3, 6, 7, 10, 11, 14, 15};
  const ilanes_t l3 = {0, 2, 4, 6, 8, 10, 12, 14}, h3 = {1, 3, 5, 7, 9, 11, 13, 15};
  for (int64_t first = 0; first < 16; first += 8) {
    const lanes_t* r = rows + first;
    lanes_t pairs[4], quads[2];
    for (int i = 0; i < 4; ++i) {
      pairs[i] = __builtin_shuffle(r[2 * i], r[2 * i + 1], l1) + __builtin_shuffle(r[2 * i], r[2 * i + 1], h1);
    }
    for (int i = 0; i < 2; ++i) {
      quads[i] = __builtin_shuffle(pairs[2 * i], pairs[2 * i + 1], l2) +
                 __builtin_shuffle(pairs[2 * i], pairs[2 * i + 1], h2);
    }
    store_lanes(out + first, __builtin_shuffle(quads[0], quads[1], l3) + __builtin_shuffle(quads[0], quads[1], h3));
  }
#else
  static_assert(kWidth == 4);
  const ilanes_t l1 = {0, 1, 4, 5}, h1 = {2, 3, 6, 7}, l2 = {0, 2, 4, 6}, h2 = {1, 3, 5, 7};
  for (int64_t first = 0; first < 16; first += 4) {
    const lanes_t* r = rows + first;
    const lanes_t a = __builtin_shuffle(r[0], r[1], l1) + __builtin_shuffle(r[0], r[1], h1);
    const lanes_t b = __builtin_shuffle(r[2], r[3], l1) + __builtin_shuffle(r[2], r[3], h1);
    store_lanes(out + first, __builtin_shuffle(a, b, l2) + __builtin_shuffle(a, b, h2));
  }
#endif
}

template <typename Shape, typename T, typename C, int HD, int MaxGroup, int Chunk, bool SoftCap>
struct NarrowDecode {
  static constexpr int kRegs = HD / kWidth;
  const Shape& s;
  lanes_t query[MaxGroup][kRegs], acc[MaxGroup][kRegs];
  float max[MaxGroup], sum[MaxGroup];
  alignas(64) float weights[MaxGroup][Chunk];

  // `sinks`: the group's sink logits (nullptr: none).
  NarrowDecode(const Shape& shape, const T* q, const float* sinks) : s(shape) {
    for (int64_t g = 0; g < s.group; ++g) {
      for (int c = 0; c < kRegs; ++c) {
        query[g][c] = load_lanes(q + g * s.q_head_stride + kWidth * c) * s.scale;
        acc[g][c] = lanes_t{};
      }
      max[g] = sinks ? sinks[g] : -std::numeric_limits<float>::infinity();
      sum[g] = sinks ? 1.f : 0.f;
    }
  }

  void scores(const C* keys, int64_t count) {
    lanes_t rows[MaxGroup][Chunk];
    for (int64_t t = 0; t < Chunk; ++t) {
      if (t >= count) {
        for (int64_t g = 0; g < s.group; ++g) rows[g][t] = lanes_t{};
        continue;
      }
      lanes_t key[kRegs];
      for (int c = 0; c < kRegs; ++c) key[c] = load_lanes(keys + t * s.slot_stride + kWidth * c);
      for (int64_t g = 0; g < s.group; ++g) {
        lanes_t partial = query[g][0] * key[0];
        for (int c = 1; c < kRegs; ++c) partial += query[g][c] * key[c];
        rows[g][t] = partial;
      }
    }
    for (int64_t g = 0; g < s.group; ++g) weigh(g, rows[g], count);
  }

  // The head's 16 scores become weights; the running max and sum, and the output, move.
  void weigh(int64_t g, const lanes_t* rows, int64_t count) {
    alignas(64) float score[Chunk];
    row_sums(rows, score);
    for (int64_t t = 0; t < Chunk; ++t) {
      if (SoftCap) score[t] = s.soft_cap * std::tanh(score[t] / s.soft_cap);
      if (t >= count) score[t] = -std::numeric_limits<float>::infinity();
    }
    lanes_t best = load_lanes(score);
    for (int64_t t = kWidth; t < Chunk; t += kWidth) {
      const lanes_t next = load_lanes(score + t);
      best = next > best ? next : best;
    }
    const float new_max = std::max(max[g], max_lanes(best));
    const float correction = fast_exp(max[g] - new_max);
    lanes_t total{};
    for (int64_t t = 0; t < Chunk; t += kWidth) {
      const lanes_t weight = exp_lanes(load_lanes(score + t) - new_max);
      store_lanes(weights[g] + t, weight);
      total += weight;
    }
    sum[g] = sum[g] * correction + sum_lanes(total);
    max[g] = new_max;
    for (int c = 0; c < kRegs; ++c) acc[g][c] *= correction;
  }

  // A query head and at most kBlockRegs registers of its dimensions at a time, the sums in
  // registers across the chunk's keys (the fp32 path's `values` says why); same order of
  // additions.
  static constexpr int block_regs() {
    for (int n = 8; n > 1; --n) {
      if (kRegs % n == 0) return n;
    }
    return 1;
  }
  static constexpr int kBlockRegs = block_regs();  // the largest divisor of kRegs up to 8

  void values(const C* values, int64_t count) {
    for (int64_t g = 0; g < s.group; ++g) {
      for (int c0 = 0; c0 < kRegs; c0 += kBlockRegs) {
        lanes_t sums[kBlockRegs];
        for (int c = 0; c < kBlockRegs; ++c) sums[c] = acc[g][c0 + c];
        for (int64_t t = 0; t < count; ++t) {
          const lanes_t weight = splat_lanes(weights[g][t]);
          const C* row = values + t * s.slot_stride + kWidth * c0;
          for (int c = 0; c < kBlockRegs; ++c) sums[c] += weight * load_lanes(row + kWidth * c);
        }
        for (int c = 0; c < kBlockRegs; ++c) acc[g][c0 + c] = sums[c];
      }
    }
  }

  // Query head g's row times `scale(g)`, head dimensions in order, into `out`.
  template <typename Out, typename Scale>
  void put_rows(Out* out, Scale scale) const {
    for (int64_t g = 0; g < s.group; ++g) {
      const float factor = scale(g);
      alignas(64) float row[HD];
      for (int c = 0; c < kRegs; ++c) store_lanes(row + kWidth * c, acc[g][c] * factor);
      for (int64_t i = 0; i < HD; ++i) out[g * HD + i] = from_float<Out>(row[i]);
    }
  }
};

}  // namespace octavo_cpu
#endif  // !__AVX512F__
