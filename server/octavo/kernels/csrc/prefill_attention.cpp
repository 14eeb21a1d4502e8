// Paged prefill attention: the prompt chunks of a step attend causally over their cached
// prefix and themselves, keys/values read from the cache blocks in place (no gather into a
// contiguous copy, no mask tensor), GQA heads sharing each key, softmax online, fp32 sums.
//
// One task is 16 query rows of one (sequence, KV head): rows are (token, query head of the
// group) pairs, and each row is one lane of a vec16. Keys go 16 at a time; a key's scores
// against the 16 rows are one vector (the key's elements broadcast against the transposed
// queries), so the running max, the exponentials and the sums are lane-wise: no horizontal
// reduction anywhere. The output is kept transposed too (a vector of 16 rows per head
// dimension) and each value element is broadcast into it.
//
// This file's tile works on fp32 copies of the 16 keys/values (converted once per key
// chunk and shared by the 16 rows), for every query and cache type (the query's, or fp8
// with k_scale folded into the scale and v_scale into the output). bf16 queries over a
// bf16 cache on a CPU with AVX512_BF16 take prefill_attention_bf16.h's tile instead.
// Options as the decode kernel: a sliding window, soft-capping, sinks.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "common.h"
#include "prefill_attention.h"
#include "prefill_attention_bf16.h"
#include "vec16.h"

#pragma GCC optimize("fp-contract=fast")
#if !defined(__AVX512F__)
#pragma GCC optimize("O2")
#endif

namespace octavo_cpu {
namespace {

using namespace prefill;

// fp32 copies of `count` cache rows starting at context position `first` (zeros after).
template <typename C>
void load_rows(float* dst, const C* base, const PrefillShape& s, const int32_t* table, int64_t first,
               int64_t count) {
  for (int64_t t = 0; t < kKeys; ++t) {
    float* row = dst + t * s.head_dim;
    if (t >= count) {
      std::fill(row, row + s.head_dim, 0.f);
      continue;
    }
    const C* src = base + slot_of(s, table, first + t) * s.slot_stride;
    for (int64_t d = 0; d < s.head_dim; d += 16) store16(row + d, load16(src + d));
  }
}

template <typename T, typename C, int HD>
struct Fp32Tile {
  alignas(64) float query[HD][kRows];  // transposed, scaled
  alignas(64) float out[HD][kRows];    // transposed accumulators
  alignas(64) float keys[kKeys * HD];
  alignas(64) float values[kKeys * HD];
  SoftmaxLanes lanes;

  void start(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, const T* query_base) {
    for (int64_t lane = 0; lane < kRows; ++lane) {
      const TileRow row = tile_row(s, seq, task, lane);
      const T* q = query_base + row.token * s.q_token_stride + row.head * s.q_head_stride;
      for (int64_t d = 0; d < HD; ++d) {
        query[d][lane] = row.valid ? to_float(q[d]) * s.scale : 0.f;
        out[d][lane] = 0.f;
      }
    }
    lanes.start(s, seq, task);
  }

  void scores(int64_t count) {
    for (int64_t t0 = 0; t0 < count; t0 += kBlock) {
      for (int64_t h = 0; h < kRows; h += kWidth) {
        lanes_t acc[kBlock] = {};
        for (int64_t d = 0; d < HD; ++d) {
          const lanes_t q = load_lanes(query[d] + h);
#pragma GCC unroll 8
          for (int64_t j = 0; j < kBlock; ++j) acc[j] += q * splat_lanes(keys[(t0 + j) * HD + d]);
        }
#pragma GCC unroll 8
        for (int64_t j = 0; j < kBlock; ++j) store_lanes(lane_data(lanes.probs[t0 + j]) + h, acc[j]);
      }
    }
  }

  void accumulate(int64_t count, const vec16& correction) {
    for (int64_t d0 = 0; d0 < HD; d0 += kBlock) {
      for (int64_t h = 0; h < kRows; h += kWidth) {
        const lanes_t rescale = load_lanes(lane_data(correction) + h);
        lanes_t acc[kBlock];
#pragma GCC unroll 8
        for (int64_t j = 0; j < kBlock; ++j) acc[j] = load_lanes(out[d0 + j] + h) * rescale;
        for (int64_t t = 0; t < count; ++t) {
          const lanes_t p = load_lanes(lane_data(lanes.probs[t]) + h);
          const float* v = values + t * HD + d0;
#pragma GCC unroll 8
          for (int64_t j = 0; j < kBlock; ++j) acc[j] += p * splat_lanes(v[j]);
        }
#pragma GCC unroll 8
        for (int64_t j = 0; j < kBlock; ++j) store_lanes(out[d0 + j] + h, acc[j]);
      }
    }
  }

  void chunk(const PrefillShape& s, const PrefillSeq& seq, const C* key_base, const C* value_base, int64_t key,
             int64_t count, bool masked) {
    load_rows(keys, key_base, s, seq.table, key, count);
    scores(count);
    const vec16 correction = lanes.weigh(s, key, count, masked);
    load_rows(values, value_base, s, seq.table, key, count);
    accumulate(count, correction);
  }

  void finish(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, T* out_base) const {
    write_rows<HD>(lanes, out, s, seq, task, out_base, [](int64_t d) { return d; });
  }
};

template <typename Tile, typename T, typename C>
void run_tile(Tile& tile, const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, const T* query,
              const C* keys, const C* values, T* out) {
  tile.start(s, seq, task, query);
  const auto [first, end] = key_range(s, seq, task.first_row);
  const int64_t low = seq.seq_len - seq.query_len + task.first_row / s.group, high = end - 1;
  const int64_t head_offset = task.kv_head * s.head_dim;
  for (int64_t key = first; key < end; key += kKeys) {
    const int64_t count = std::min(kKeys, end - key);
    const bool masked = key + count - 1 > low || (s.window > 0 && key <= high - s.window);
    tile.chunk(s, seq, keys + head_offset, values + head_offset, key, count, masked);
  }
  tile.finish(s, seq, task, out);
}

// Every tile of every sequence, the costliest first (the schedule hands them out in order).
std::vector<PrefillTask> plan_tasks(const PrefillShape& s, const std::vector<PrefillSeq>& seqs) {
  std::vector<PrefillTask> tasks;
  for (int64_t b = 0; b < static_cast<int64_t>(seqs.size()); ++b) {
    const int64_t rows = seqs[b].query_len * s.group;
    for (int64_t first_row = 0; first_row < rows; first_row += kRows) {
      const auto [first, end] = key_range(s, seqs[b], first_row);
      for (int64_t h = 0; h < s.kv_heads; ++h) tasks.push_back({b, h, first_row, end - first});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) { return a.cost > b.cost; });
  return tasks;
}

template <typename Tile, typename T, typename C>
void run_tiles(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache, const PrefillShape& s,
               const std::vector<PrefillSeq>& seqs) {
  const std::vector<PrefillTask> tasks = plan_tasks(s, seqs);
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

template <typename T, typename C, int HD>
void run_prefill(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache, const PrefillShape& s,
                 const std::vector<PrefillSeq>& seqs) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, bf16_bits> && std::is_same_v<C, bf16_bits> && HD % 32 == 0) {
    if (s.bf16_dot) return run_tiles<Bf16PrefillTile<HD>, T, C>(out, query, kv_cache, s, seqs);
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
