// Shared parts of the paged prefill attention kernels (prefill_attention.cpp, fp32 sums
// over fp32 keys/values; prefill_attention_bf16.h, vdpbf16ps on the cache as stored): a
// lane group of 16 query rows, each row one lane of a vec16 (a task is one or two groups),
// and the lane-wise online softmax over a chunk of 16 keys.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "attention_shape.h"
#include "common.h"
#include "lanes.h"
#include "vec16.h"

namespace octavo_cpu {
namespace prefill {

constexpr int64_t kRows = 16;  // query rows per lane group: the lanes of a vec16
constexpr int64_t kKeys = 16;  // keys per chunk
constexpr int64_t kBlock = 8;  // accumulators kept in registers
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using PrefillShape = AttentionShape;

// A row of zeros to read in place of a padding row: 256 fp32 or 512 bf16 elements.
alignas(64) inline constexpr float kZeroRow[256] = {};

// A tile's rows of one (sequence, KV head): rows first_row.. of the sequence's query_len * group.
struct PrefillTask {
  int64_t seq, kv_head, first_row;
  int64_t cost;  // keys the tile reads, for the schedule
};

// What one sequence contributes: its query tokens in `query` and its context length.
struct PrefillSeq {
  int64_t query_start, query_len, seq_len;
  const int32_t* table;
};

// Lane group `group` of a task that takes several: its 16 rows, from the task's first row
// on.
inline PrefillTask group_task(const PrefillTask& task, int64_t group) {
  return {task.seq, task.kv_head, task.first_row + group * kRows, task.cost};
}

// Where lane `lane` of a task reads its query and writes its output (valid: a real row).
struct TileRow {
  int64_t token, head;
  bool valid;
};

inline TileRow tile_row(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, int64_t lane) {
  const int64_t row = task.first_row + lane;
  return {seq.query_start + row / s.group, task.kv_head * s.group + row % s.group, row < seq.query_len * s.group};
}

// Where the chunk's `count` keys from context position `first` start in the cache (elements
// from the head's base).
inline void chunk_offsets(const PrefillShape& s, const int32_t* table, int64_t first, int64_t count,
                          int64_t* offsets) {
  CacheCursor cursor(s, first);
  for (int64_t t = 0; t < count; ++t, cursor.advance(s, 1)) offsets[t] = cursor.offset(s, table);
}

// The lane-wise softmax state of a tile: running max and sum, each row's position, and
// the current chunk's scores (then weights).
template <int64_t Keys>
struct SoftmaxLanesOf {
  static constexpr int64_t kMaxChains = 4;  // weigh() folds exactly 4

  vec16 max, sum;
  ivec16 pos;  // each row's context position (-1: a padding lane)
  vec16 probs[Keys];

  void start(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task) {
    for (int64_t lane = 0; lane < kRows; ++lane) {
      const TileRow row = tile_row(s, seq, task, lane);
      pos[lane] = row.valid ? static_cast<int32_t>(seq.seq_len - seq.query_len + row.token - seq.query_start) : -1;
      const bool sink = row.valid && s.sinks != nullptr;
      max[lane] = sink ? s.sinks[row.head] : kNegInf;
      sum[lane] = sink ? 1.f : 0.f;
    }
  }

  // Scores times `scale` (1: scaled already) become weights (masked keys, and keys at or
  // past `count`, get 0); the running max and sum move; returns the factor that rescales
  // what was accumulated before. The scale goes into the exponent's multiply-add: a pass
  // over the scores fewer.
  vec16 weigh(const PrefillShape& s, int64_t first_key, int64_t count, bool masked, float scale = 1.f) {
    if (s.soft_cap > 0.f) {
      for (int64_t t = 0; t < count; ++t) probs[t] = tanh16(probs[t] * (scale / s.soft_cap)) * s.soft_cap;
      scale = 1.f;
    }
    const lanes_t scales = splat_lanes(scale);
    vec16 correction;
    for (int64_t h = 0; h < kRows; h += kWidth) {
      const ilanes_t rows = load_ilanes(reinterpret_cast<const int32_t*>(&pos) + h);
      const lanes_t old_max = load_lanes(lane_data(max) + h);
      const auto visible_score = [&](int64_t t) {
        lanes_t score = load_lanes(lane_data(probs[t]) + h);
        if (masked) {
          const int32_t key = static_cast<int32_t>(first_key + t);
          ilanes_t visible = rows >= key;
          if (s.window > 0) visible &= rows < key + static_cast<int32_t>(s.window);
          score = visible ? score : splat_lanes(kNegInf);
          store_lanes(lane_data(probs[t]) + h, score);
        }
        return score;
      };
      lanes_t maxima[kMaxChains];  // independent chains: one would wait on each max in turn
      for (lanes_t& chain : maxima) chain = splat_lanes(kNegInf);
      int64_t seen = 0;
      for (; seen + kMaxChains <= count; seen += kMaxChains) {
#pragma GCC unroll 4
        for (int64_t c = 0; c < kMaxChains; ++c) maxima[c] = larger_lanes(maxima[c], visible_score(seen + c));
      }
      for (; seen < count; ++seen) maxima[0] = larger_lanes(maxima[0], visible_score(seen));
      const lanes_t chunk_max = larger_lanes(larger_lanes(maxima[0], maxima[1]), larger_lanes(maxima[2], maxima[3]));
      const lanes_t new_max = larger_lanes(old_max, chunk_max * scales);  // scale > 0
      const ilanes_t empty = new_max == kNegInf;  // no visible key yet: nothing to rescale
      const lanes_t base = empty ? lanes_t{} : new_max;
      const lanes_t rescale = empty ? splat_lanes(1.f) : exp_lanes(old_max - base);
      lanes_t total = load_lanes(lane_data(sum) + h) * rescale;
      for (int64_t t = 0; t < Keys; ++t) {
        if (t >= count) {
          store_lanes(lane_data(probs[t]) + h, lanes_t{});
          continue;
        }
        const lanes_t score = load_lanes(lane_data(probs[t]) + h);
        const lanes_t weight = score == kNegInf ? lanes_t{} : exp_lanes(multiply_add(score, scales, -base));
        store_lanes(lane_data(probs[t]) + h, weight);
        total += weight;
      }
      store_lanes(lane_data(sum) + h, total);
      store_lanes(lane_data(max) + h, new_max);
      store_lanes(lane_data(correction) + h, rescale);
    }
    return correction;
  }

  // 1 / sum per lane, times the output scale (0 where nothing was seen).
  float inverse(const PrefillShape& s, int64_t lane) const {
    return normaliser(s, sum[lane]);
  }
};

using SoftmaxLanes = SoftmaxLanesOf<kKeys>;

// Each real row's output: `row_of(lane, buffer)` gives the row's HD sums in head-dimension
// order (its accumulators in place, or `buffer` filled), written over the softmax sum to
// the row's token and head. A whole row at a time: a call per element (GCC kept the
// element-wise lambdas out of line) cost 6-9 % of the fp32 tile at 1,536 tokens.
template <int HD, typename T, typename RowOf, int64_t Keys>
void write_rows(const SoftmaxLanesOf<Keys>& lanes, const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task,
                T* out_base, RowOf row_of) {
  alignas(64) float buffer[HD];
  for (int64_t lane = 0; lane < kRows; ++lane) {
    const TileRow row = tile_row(s, seq, task, lane);
    if (!row.valid) break;
    const float inv = lanes.inverse(s, lane);
    const float* sums = row_of(lane, buffer);
    T* o = out_base + (row.token * s.heads + row.head) * HD;
    for (int64_t d = 0; d < HD; ++d) o[d] = from_float<T>(sums[d] * inv);
  }
}

// The context positions that `task_rows` rows from first_row see: [first, end).
inline std::pair<int64_t, int64_t> key_range(const PrefillShape& s, const PrefillSeq& seq, int64_t first_row,
                                             int64_t task_rows) {
  const int64_t rows = seq.query_len * s.group, first_pos = seq.seq_len - seq.query_len;
  const int64_t low = first_pos + first_row / s.group;
  const int64_t high = first_pos + (std::min(first_row + task_rows, rows) - 1) / s.group;
  const int64_t first = s.window > 0 ? std::max<int64_t>(0, low - s.window + 1) : 0;
  return {first, high + 1};
}

}  // namespace prefill
}  // namespace octavo_cpu
