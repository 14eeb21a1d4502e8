// Paged prefill attention: the prompt chunks of a step attend causally over their cached
// prefix and themselves, keys/values read from the cache blocks in place (no gather into a
// contiguous copy, no mask tensor), GQA heads sharing each key, softmax online, fp32 sums.
//
// A lane group is 16 query rows of one (sequence, KV head): rows are (token, query head of
// the group) pairs, and each row is one lane of a vec16. Keys go 16 at a time; a key's
// scores against the 16 rows are one vector (the key's elements broadcast against the
// transposed queries), so the running max, the exponentials and the sums are lane-wise: no
// horizontal reduction anywhere.
//
// This file's tile (a task: two lane groups, 32 rows, on AVX-512; one elsewhere) reads an
// fp32 cache's key and value rows in place (other cache types: fp32 copies of a chunk's 16
// rows, converted once and shared by the rows), for every query and cache type (the
// query's, or fp8 with k_scale folded into the scale and v_scale into the output). Its
// output accumulators are row-major: each value vector serves 4 rows and each broadcast
// weight 4 vectors. bf16 queries over a bf16 cache on an AMD CPU with AVX512_BF16 take
// prefill_attention_bf16.h's tile instead (one lane group, the output transposed; Intel
// cores run its vdpbf16ps at half their FMA rate: an Intel Xeon without AMX, 2 vCPUs, 9 / 3
// heads of 64, 512 tokens 1.99 ms on it, 1.22-1.53 on this tile), and
// where the CPU also has AMX tiles, prefill_attention_amx.h's (both products on tile
// registers; 9 query / 3 KV heads of 64, 2 Intel Xeon cores, bf16, a 1,536-token prompt:
// 20.3 -> 7.3 ms with 16-row tasks and 32-key chunks; 5.9 -> 3.0 ms with 32-row tasks,
// 64-key spans, fused exponentials and the transpositions in registers, where vLLM's CPU
// attention takes 3.3 ms; 512 tokens 0.40 ms against its 0.42, 6,000 41 against 45).
// Options as the decode kernel: a sliding window, soft-capping, sinks.
//
// fp32, 9 query / 3 KV heads of 64, one thread, a 1,536-token prompt on an AMD EPYC (Zen 5):
// 115 GFLOP/s with one 16-row group, transposed output and a division per key, 157 now (a
// Zen 5 core peaks at ~262 in FMAs; the exponentials are most of the rest). Keys read in
// place rather than copied: 157 -> 161 (the AVX2 build, 1,536 tokens: 38.4 -> 35.0 ms).
// Output rows written a row at a time (write_rows) and the queries transposed in registers:
// 161 -> 185-189 (512 tokens: 133 -> 193); the scores and the weighted sum now each run at
// about 92 % of the FMA peak, the weighing is 7 % of the tile.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include <ATen/ops/empty.h>

#include "common.h"
#include "prefill_attention.h"
#include "prefill_attention_amx.h"
#include "prefill_attention_bf16.h"
#include "vec16.h"

#pragma GCC optimize("fp-contract=fast")
#if !defined(__AVX512F__)
#pragma GCC optimize("O2")
#endif

namespace octavo_cpu {
namespace {

using namespace prefill;

// fp32 copies of a chunk's `count` cache rows (zeros after), at `offsets` from `base`.
template <int HD, typename C>
void load_rows(float* dst, const C* base, const int64_t* offsets, int64_t count) {
  for (int64_t t = 0; t < kKeys; ++t) {
    float* row = dst + t * HD;
    if (t >= count) {
      std::fill(row, row + HD, 0.f);
      continue;
    }
    const C* src = base + offsets[t];
    for (int64_t d = 0; d < HD; d += 16) store16(row + d, load16(src + d));
  }
}


// The chunk's cache rows as fp32, a pointer per row (zeros past `count`): an fp32 cache is
// read in place, other types are widened into `copies`.
template <int HD, typename C>
void cache_rows(const float** rows, float* copies, const C* base, const int64_t* offsets, int64_t count) {
  if constexpr (std::is_same_v<C, float>) {
    for (int64_t t = 0; t < kKeys; ++t) rows[t] = t < count ? base + offsets[t] : kZeroRow;
  } else {
    load_rows<HD>(copies, base, offsets, count);
    for (int64_t t = 0; t < kKeys; ++t) rows[t] = copies + t * HD;
  }
}

// The weighted values go into row-major accumulators, kOutRows rows by kDimVecs vectors of
// head dimensions at a time: each value vector serves kOutRows rows and each broadcast
// weight kDimVecs vectors (the scores' layout, a row per lane, would broadcast every value
// element for a single FMA, and a broadcast per FMA caps the FMA rate at 70-85 %).
constexpr int64_t kOutRows = kWidth == 16 ? 4 : 2;
constexpr int64_t kDimVecs = 4;

template <typename T, typename C, int HD>
struct Fp32Tile {
  // AVX-512 tiles take 32 rows, two lane groups (a SoftmaxLanes each): each key element
  // broadcast in the scores then serves two row vectors, and each key copy twice the rows
  // (AVX2: the one group's 16 rows are two vectors already).
  static constexpr int64_t kGroups = kWidth == 16 ? 2 : 1;
  static constexpr int64_t kTaskRows = kRows * kGroups;
  static constexpr int64_t kScoreVecs = 2;                      // row vectors per scores pass
  static constexpr int64_t kScoreKeys = kWidth == 16 ? 8 : 4;    // keys per pass: 16 or 8 accumulators
  static constexpr int64_t kVecs = HD / kWidth;                 // vectors in a head's row
  static constexpr int64_t kBlockVecs = kWidth == 16 && kVecs <= 6 ? kVecs : kDimVecs;

  alignas(64) float query[HD][kTaskRows];  // transposed, scaled
  alignas(64) float out[kTaskRows][HD];    // accumulators, a row per query row
  alignas(64) float keys[kKeys * HD];    // widened key and value rows of a non-fp32 cache
  alignas(64) float values[kKeys * HD];
  SoftmaxLanes lanes[kGroups];
  vec16 correction[kGroups];

  void start(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, const T* query_base) {
    load_queries(s, seq, task, query_base);
    std::fill(&out[0][0], &out[0][0] + kTaskRows * HD, 0.f);
    for (int64_t g = 0; g < kGroups; ++g) lanes[g].start(s, seq, group_task(task, g));
  }

  // The rows' queries, scaled, into `query` (a dimension's rows side by side; padding rows
  // read zeros), a kWidth x kWidth block at a time. Queries of another type are widened
  // into `out` first (it is cleared after).
  void load_queries(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, const T* query_base) {
    const float* rows[kTaskRows];
    for (int64_t lane = 0; lane < kTaskRows; ++lane) {
      const TileRow row = tile_row(s, seq, task, lane);
      const T* q = query_base + row.token * s.q_token_stride + row.head * s.q_head_stride;
      if (!row.valid) {
        rows[lane] = kZeroRow;
      } else if constexpr (std::is_same_v<T, float>) {
        rows[lane] = q;
      } else {
        for (int64_t d = 0; d < HD; d += kWidth) store_lanes(out[lane] + d, load_lanes(q + d));
        rows[lane] = out[lane];
      }
    }
    for (int64_t h = 0; h < kTaskRows; h += kWidth) {
      for (int64_t d = 0; d < HD; d += kWidth) transpose_lanes(rows + h, d, query[d] + h, kTaskRows, s.scale);
    }
  }

  float* probs(int64_t row, int64_t t) { return lane_data(lanes[row / kRows].probs[t]) + row % kRows; }

  void scores(const float* const* key_rows, int64_t count) {
    for (int64_t t0 = 0; t0 < count; t0 += kScoreKeys) {
      for (int64_t h = 0; h < kTaskRows; h += kScoreVecs * kWidth) {
        lanes_t acc[kScoreVecs][kScoreKeys] = {};
        for (int64_t d = 0; d < HD; ++d) {
          lanes_t q[kScoreVecs];
#pragma GCC unroll 2
          for (int64_t r = 0; r < kScoreVecs; ++r) q[r] = load_lanes(query[d] + h + r * kWidth);
#pragma GCC unroll 8
          for (int64_t j = 0; j < kScoreKeys; ++j) {
            const lanes_t key = splat_lanes(key_rows[t0 + j][d]);
#pragma GCC unroll 2
            for (int64_t r = 0; r < kScoreVecs; ++r) acc[r][j] += q[r] * key;
          }
        }
        for (int64_t r = 0; r < kScoreVecs; ++r) {
#pragma GCC unroll 8
          for (int64_t j = 0; j < kScoreKeys; ++j) store_lanes(probs(h + r * kWidth, t0 + j), acc[r][j]);
        }
      }
    }
  }

  // Rows first_row.. by head dimensions d0 + [0, NV * kWidth): rescaled, then each key's
  // weight times its value row added.
  template <int64_t NV>
  void accumulate_block(const float* const* rows, int64_t count, int64_t first_row, int64_t d0) {
    lanes_t acc[kOutRows][NV];
#pragma GCC unroll 8
    for (int64_t i = 0; i < kOutRows; ++i) {
      const int64_t row = first_row + i;
      const lanes_t rescale = splat_lanes(lane_data(correction[row / kRows])[row % kRows]);
#pragma GCC unroll 8
      for (int64_t v = 0; v < NV; ++v) acc[i][v] = load_lanes(out[row] + d0 + v * kWidth) * rescale;
    }
    for (int64_t t = 0; t < count; ++t) {
      lanes_t value[NV];
#pragma GCC unroll 8
      for (int64_t v = 0; v < NV; ++v) value[v] = load_lanes(rows[t] + d0 + v * kWidth);
#pragma GCC unroll 8
      for (int64_t i = 0; i < kOutRows; ++i) {
        const lanes_t weight = splat_lanes(*probs(first_row + i, t));
#pragma GCC unroll 8
        for (int64_t v = 0; v < NV; ++v) acc[i][v] += weight * value[v];
      }
    }
#pragma GCC unroll 8
    for (int64_t i = 0; i < kOutRows; ++i) {
#pragma GCC unroll 8
      for (int64_t v = 0; v < NV; ++v) store_lanes(out[first_row + i] + d0 + v * kWidth, acc[i][v]);
    }
  }

  void accumulate(const float* const* rows, int64_t count) {
    constexpr int64_t kFull = kVecs / kBlockVecs * kBlockVecs, kTail = kVecs - kFull;
    for (int64_t first_row = 0; first_row < kTaskRows; first_row += kOutRows) {
      for (int64_t v0 = 0; v0 < kFull; v0 += kBlockVecs) accumulate_block<kBlockVecs>(rows, count, first_row, v0 * kWidth);
      if constexpr (kTail > 0) accumulate_block<kTail>(rows, count, first_row, kFull * kWidth);
    }
  }

  void chunk(const PrefillShape& s, const PrefillSeq& seq, const C* key_base, const C* value_base, int64_t key,
             int64_t count, bool masked) {
    int64_t offsets[kKeys];
    chunk_offsets(s, seq.table, key, count, offsets);
    const float* rows[kKeys];
    cache_rows<HD>(rows, keys, key_base, offsets, count);
    scores(rows, count);
    for (int64_t g = 0; g < kGroups; ++g) correction[g] = lanes[g].weigh(s, key, count, masked);
    cache_rows<HD>(rows, values, value_base, offsets, count);
    accumulate(rows, count);
  }

  void finish(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, T* out_base) const {
    for (int64_t g = 0; g < kGroups; ++g) {
      const auto row_of = [this, g](int64_t lane, float*) -> const float* { return out[g * kRows + lane]; };
      write_rows<HD>(lanes[g], s, seq, group_task(task, g), out_base, row_of);
    }
  }
};

template <typename Tile, typename T, typename C>
void run_tile(Tile& tile, const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, const T* query,
              const C* keys, const C* values, T* out) {
  tile.start(s, seq, task, query);
  const auto [first, end] = key_range(s, seq, task.first_row, Tile::kTaskRows);
  const int64_t low = seq.seq_len - seq.query_len + task.first_row / s.group, high = end - 1;
  const int64_t head_offset = task.kv_head * s.head_dim;
  for (int64_t key = first; key < end; key += kKeys) {
    const int64_t count = std::min(kKeys, end - key);
    const bool masked = key + count - 1 > low || (s.window > 0 && key <= high - s.window);
    tile.chunk(s, seq, keys + head_offset, values + head_offset, key, count, masked);
  }
  tile.finish(s, seq, task, out);
}

// Every tile of every sequence, `task_rows` rows each, the costliest first (the schedule
// hands them out in order).
std::vector<PrefillTask> plan_tasks(const PrefillShape& s, const std::vector<PrefillSeq>& seqs, int64_t task_rows) {
  std::vector<PrefillTask> tasks;
  for (int64_t b = 0; b < static_cast<int64_t>(seqs.size()); ++b) {
    const int64_t rows = seqs[b].query_len * s.group;
    for (int64_t first_row = 0; first_row < rows; first_row += task_rows) {
      const auto [first, end] = key_range(s, seqs[b], first_row, task_rows);
      for (int64_t h = 0; h < s.kv_heads; ++h) tasks.push_back({b, h, first_row, end - first});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) { return a.cost > b.cost; });
  return tasks;
}

template <typename Tile, typename T, typename C>
void run_tiles(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache, const PrefillShape& s,
               const std::vector<PrefillSeq>& seqs) {
  const std::vector<PrefillTask> tasks = plan_tasks(s, seqs, Tile::kTaskRows);
  const int64_t num_slots = kv_cache.size(1) * kv_cache.size(2);
  const C* keys = ptr<C>(kv_cache);
  const C* values = keys + num_slots * s.slot_stride;
  const T* q = ptr<T>(query);
  T* o = ptr<T>(out);
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(tasks.size()));
  // Each worker takes the next task until none is left: tiles differ in cost (a tile late
  // in a long prompt reads every key before it), so a static split would leave threads idle.
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    auto tile = std::make_unique<Tile>();
    for (int64_t i = next++; i < static_cast<int64_t>(tasks.size()); i = next++) {
      run_tile(*tile, s, seqs[tasks[i].seq], tasks[i], q, keys, values, o);
    }
  });
}

#if defined(OCTAVO_HAS_AMX)
// Every sequence's values transposed per KV head, [kv_heads, HD, padded] bf16 from
// `first[b]`: positions past the context up to a multiple of 32 are zeros, so a chunk's
// tile never reads past its sequence's part.
struct TransposedValues {
  at::Tensor storage;
  std::vector<int64_t> first, padded;

  const uint16_t* of(int64_t seq, int64_t kv_head, int64_t head_dim) const {
    return ptr<uint16_t>(storage) + first[seq] + kv_head * head_dim * padded[seq];
  }
};

// dst[d * stride + k] = bf16 element d of rows[k] for k < 16 (rows read as 32-bit pairs of
// dims): 16 x 16 blocks of pairs turned in registers, each column of pairs split into its
// two dims' rows (element by element it was 18 % of the AMX prefill at 512 tokens).
template <int HD>
void transpose_pairs(const float* const* rows, uint16_t* dst, int64_t stride) {
  for (int64_t p0 = 0; p0 < HD / 2; p0 += 16) {
    __m512 columns[16];
    transpose_16x16(rows, p0, columns);
    for (int64_t j = 0; j < 16; ++j) {
      const __m512i pairs = _mm512_castps_si512(columns[j]);
      uint16_t* even = dst + 2 * (p0 + j) * stride;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(even), _mm512_cvtepi32_epi16(pairs));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(even + stride), _mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
    }
  }
}

template <int HD>
TransposedValues transpose_values(const PrefillShape& s, const std::vector<PrefillSeq>& seqs, const uint16_t* values) {
  TransposedValues t;
  std::vector<int64_t> chunks_before{0};  // 16-position chunks of all (seq, KV head) before
  int64_t total = 0;
  for (const PrefillSeq& seq : seqs) {
    t.padded.push_back((seq.seq_len + kAmxKeys - 1) / kAmxKeys * kAmxKeys);
    t.first.push_back(total);
    total += s.kv_heads * HD * t.padded.back();
    chunks_before.push_back(chunks_before.back() + s.kv_heads * t.padded.back() / kKeys);
  }
  t.storage = at::empty({std::max<int64_t>(total, 1)}, at::kBFloat16);
  at::parallel_for(0, chunks_before.back(), 16, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = std::upper_bound(chunks_before.begin(), chunks_before.end(), item) - chunks_before.begin() - 1;
      const int64_t chunks = t.padded[b] / kKeys, within = item - chunks_before[b];
      const int64_t h = within / chunks, first = within % chunks * kKeys;
      const float* rows[kKeys];  // the keys' value rows, read as pairs of dims (zeros past the context)
      CacheCursor cursor(s, first);
      for (int64_t k = 0; k < kKeys; ++k, cursor.advance(s, 1)) {
        const bool real = first + k < seqs[b].seq_len;
        rows[k] = real ? reinterpret_cast<const float*>(values + h * HD + cursor.offset(s, seqs[b].table)) : kZeroRow;
      }
      transpose_pairs<HD>(rows, const_cast<uint16_t*>(t.of(b, h, HD)) + first, t.padded[b]);
    }
  });
  return t;
}

// One task on the AMX tile: spans start at multiples of 32 (keys before the task's first
// visible one are masked as any other invisible key).
template <int HD>
void run_amx_tile(AmxPrefillTile<HD>& tile, const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task,
                  const uint16_t* query, const uint16_t* keys, const TransposedValues& values, uint16_t* out) {
  tile.start(s, seq, task, query);
  tile.values = values.of(task.seq, task.kv_head, HD);
  tile.values_stride = values.padded[task.seq];
  const auto [first, end] = key_range(s, seq, task.first_row, AmxPrefillTile<HD>::kTaskRows);
  const int64_t low = seq.seq_len - seq.query_len + task.first_row / s.group, high = end - 1;
  const uint16_t* head_keys = keys + task.kv_head * HD;
  const auto rows_of = [&](int64_t key) {
    const int64_t slot = static_cast<int64_t>(seq.table[key / s.block_size]) * s.block_size + key % s.block_size;
    return head_keys + slot * s.slot_stride;
  };
  const auto issue_scores = [&](int64_t key) {
    const int64_t count = std::min(kAmxSpan, end - key);
    for (int64_t t = 0; t < count; t += kAmxKeys) {
      const uint16_t* rows = rows_of(key + t);
      tile.scores(rows, count > t + kKeys ? rows_of(key + t + kKeys) : rows, s.slot_stride, t);
    }
  };
  const int64_t start = first / kAmxKeys * kAmxKeys;
  issue_scores(start);
  for (int64_t key = start; key < end; key += kAmxSpan) {
    const int64_t count = std::min(kAmxSpan, end - key);
    const bool masked = key + count - 1 > low || (s.window > 0 && key <= high - s.window);
    tile.weigh(s, key, count, masked);
    if (key + kAmxSpan < end) issue_scores(key + kAmxSpan);
    tile.add_weighted_sums(key, count);
  }
  tile.finish(s, seq, task, out);
}

template <int HD>
OCTAVO_AMX_TARGET void amx_worker(const PrefillShape& s, const std::vector<PrefillSeq>& seqs,
                                  const std::vector<PrefillTask>& tasks, std::atomic<int64_t>& next,
                                  const uint16_t* query, const uint16_t* keys, const TransposedValues& values,
                                  uint16_t* out) {
  const TileConfig config = full_tile_config();
  load_tile_config(config);
  auto tile = std::make_unique<AmxPrefillTile<HD>>();
  for (int64_t i = next++; i < static_cast<int64_t>(tasks.size()); i = next++) {
    run_amx_tile(*tile, s, seqs[tasks[i].seq], tasks[i], query, keys, values, out);
  }
  _tile_release();
}

template <int HD>
void run_amx_tiles(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache, const PrefillShape& s,
                   const std::vector<PrefillSeq>& seqs) {
  // One KV head's tasks after another (the costliest first within each): both threads then
  // stream the same head's keys and values, which stay in their L2s, where alternating
  // heads made each L2 hold three heads' (512 rows over 6,000 positions, 2 Xeon cores:
  // 26.4 -> 20.4 ms).
  std::vector<PrefillTask> tasks = plan_tasks(s, seqs, AmxPrefillTile<HD>::kTaskRows);
  std::stable_sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) { return a.kv_head < b.kv_head; });
  const uint16_t* keys = ptr<uint16_t>(kv_cache);
  const TransposedValues values =
      transpose_values<HD>(s, seqs, keys + kv_cache.size(1) * kv_cache.size(2) * s.slot_stride);
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(tasks.size()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    amx_worker<HD>(s, seqs, tasks, next, ptr<uint16_t>(query), keys, values, ptr<uint16_t>(out));
  });
}
#endif

template <typename T, typename C, int HD>
void run_prefill(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache, const PrefillShape& s,
                 const std::vector<PrefillSeq>& seqs) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, bf16_bits> && std::is_same_v<C, bf16_bits> && HD % 32 == 0) {
#if defined(OCTAVO_HAS_AMX)
    if (s.bf16_dot && s.block_size % kKeys == 0 && amx_enabled()) return run_amx_tiles<HD>(out, query, kv_cache, s, seqs);
#endif
    // On Intel the fp32 tile's FMAs outrun vdpbf16ps (bf16_dot_for_rows).
    if (s.bf16_dot && bf16_dot_for_rows(Bf16PrefillTile<HD>::kTaskRows)) {
      return run_tiles<Bf16PrefillTile<HD>, T, C>(out, query, kv_cache, s, seqs);
    }
  }
#endif
  run_tiles<Fp32Tile<T, C, HD>, T, C>(out, query, kv_cache, s, seqs);
}

void check_prefill_inputs(const at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                          const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                          const at::Tensor& seq_lens) {
  const char* op = "paged_prefill_attention";
  check_cpu(query, op);
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1, op, ": query must be [tokens, heads, head_dim]");
  TORCH_CHECK(out.sizes() == query.sizes() && out.is_contiguous() && out.scalar_type() == query.scalar_type(), op,
              ": out must be contiguous like query");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.is_contiguous() && kv_cache.size(0) == 2 && kv_cache.size(4) == query.size(2),
              op, ": kv_cache must be contiguous [2, blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(kv_cache.scalar_type() == query.scalar_type() || is_fp8_cache(kv_cache.scalar_type()), op,
              ": kv_cache must have the query's dtype or be float8 (e4m3fn / e5m2)");
  TORCH_CHECK(query.size(1) % kv_cache.size(3) == 0, op, ": heads must be a multiple of kv_heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 && block_tables.is_contiguous(), op,
              ": block_tables must be int32 [seqs, max_blocks]");
  const int64_t seqs = block_tables.size(0);
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() && seq_lens.numel() == seqs, op,
              ": seq_lens must be int32 [seqs]");
  TORCH_CHECK(query_start_loc.scalar_type() == at::kInt && query_start_loc.is_contiguous() &&
                  query_start_loc.numel() == seqs + 1,
              op, ": query_start_loc must be int32 [seqs + 1]");
}

// The sequences, each checked: queries inside `query`, no more queries than context,
// the context inside its block table.
std::vector<PrefillSeq> prefill_seqs(const PrefillShape& s, const at::Tensor& query, const at::Tensor& block_tables,
                                     const at::Tensor& query_start_loc, const at::Tensor& seq_lens) {
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  std::vector<PrefillSeq> seqs;
  for (int64_t b = 0; b < block_tables.size(0); ++b) {
    const int64_t start = starts[b], query_len = starts[b + 1] - start, seq_len = lens[b];
    TORCH_CHECK(start >= 0 && query_len >= 0 && starts[b + 1] <= query.size(0),
                "paged_prefill_attention: query_start_loc out of range");
    TORCH_CHECK(query_len <= seq_len && seq_len <= s.max_blocks * s.block_size,
                "paged_prefill_attention: seq_len out of range");
    seqs.push_back({start, query_len, seq_len, tables + b * s.max_blocks});
  }
  return seqs;
}

}  // namespace

void paged_prefill_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                             const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                             const at::Tensor& seq_lens, double scale, double k_scale, double v_scale, int64_t window,
                             double soft_cap, const c10::optional<at::Tensor>& sinks) {
  check_prefill_inputs(out, query, kv_cache, block_tables, query_start_loc, seq_lens);
  const float* sink_data = check_attention_options(query, window, soft_cap, sinks, "paged_prefill_attention");
  const PrefillShape s = attention_shape(query, kv_cache, block_tables, scale, k_scale, v_scale, window, soft_cap,
                                         sink_data, "paged_prefill_attention");
  const std::vector<PrefillSeq> seqs = prefill_seqs(s, query, block_tables, query_start_loc, seq_lens);
  dispatch_float_bf16(query.scalar_type(), "paged_prefill_attention", [&]<typename T>() {
    dispatch_cache<T>(kv_cache.scalar_type(), [&]<typename C>() {
      switch (s.head_dim) {
        case 64: return run_prefill<T, C, 64>(out, query, kv_cache, s, seqs);
        case 80: return run_prefill<T, C, 80>(out, query, kv_cache, s, seqs);
        case 96: return run_prefill<T, C, 96>(out, query, kv_cache, s, seqs);
        case 128: return run_prefill<T, C, 128>(out, query, kv_cache, s, seqs);
        case 256: return run_prefill<T, C, 256>(out, query, kv_cache, s, seqs);
        default: TORCH_CHECK(false, "paged_prefill_attention: head_dim must be 64, 80, 96, 128 or 256");
      }
    });
  });
}

}  // namespace octavo_cpu
