// Paged decode attention: one query token per sequence, keys/values read from the cache
// blocks in place (no gather), the query heads that share a KV head handled together (GQA),
// softmax computed online block by block, accumulation in fp32. The cache holds the query's
// type (T) or fp8 (C = fp8_e4m3 / fp8_e5m2, see common.h): k_scale is folded into the
// query's scale and v_scale into the final normalisation.
//
// Per-layer options (octavo.attention.options): a sliding window starts the walk at the
// first visible position (whole blocks before it are never read); soft-capping rewrites
// each score as cap * tanh(score / cap); a sink starts each head's running softmax at
// (max = sink, sum = 1) with nothing accumulated, i.e. one extra logit in the denominator.
// Plain layers run the same loops as before: soft-capping is a template flag.
//
// A few long sequences (fewer walks than threads can share evenly) are split into parts
// walked by any thread and merged after: one fp32 sequence of 3 KV heads on 2 threads,
// 16,384 keys 0.69 -> 0.50 ms, 4,096 0.135 -> 0.104, 1,024 0.035 -> 0.029 (Zen 5 VM);
// single-stream decode at a 7,000-token context 29 -> 32 tok/s.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_shape.h"
#include "common.h"
#include "decode_attention_amx.h"
#include "decode_attention_bf16.h"
#include "decode_attention_narrow.h"
#include "vec16.h"

// Attention sums in its own order anyway: let multiply-adds fuse here (the build turns
// contraction off for the kernels that must round exactly as torch does).
#pragma GCC optimize("fp-contract=fast")
// AVX2 and generic builds: -O3 spent most of the build on this file (decode_attention.o
// 36 s CPU for avx2, 60 s generic, vs 16 s for avx512); at O2 it takes 18 s / 21 s. Their
// fast path is NarrowDecode (decode_attention_narrow.h); ChunkedDecode below is the
// AVX-512 build's, which keeps -O3.
#if !defined(__AVX512F__)
#pragma GCC optimize("O2")
#endif

namespace octavo_cpu {
namespace {

using DecodeShape = AttentionShape;

// The first context position the query (at seq_len - 1) sees.
inline int64_t first_visible(const DecodeShape& s, int64_t seq_len) {
  return s.window > 0 ? std::max<int64_t>(0, seq_len - s.window) : 0;
}

// Running softmax state of the `group` query heads of one (sequence, KV head) pair.
struct OnlineSoftmax {
  std::vector<float> query, acc, max, sum, scores;

  // `sinks`: the group's sink logits (nullptr: none).
  OnlineSoftmax(const DecodeShape& s, const float* sinks)
      : query(s.group * s.head_dim), acc(s.group * s.head_dim, 0.f),
        max(s.group, -std::numeric_limits<float>::infinity()), sum(s.group, 0.f),
        scores(s.group * s.block_size) {
    if (sinks == nullptr) return;
    for (int64_t g = 0; g < s.group; ++g) {
      max[g] = sinks[g];
      sum[g] = 1.f;
    }
  }
};

// Scores of every query head of the group against the block's `count` keys. `HD` is the
// head size when known at compile time (0: read it from the shape).
template <typename C, int HD>
void score_block(OnlineSoftmax& st, const DecodeShape& s, const C* keys, int64_t count) {
  const int64_t dim = HD > 0 ? HD : s.head_dim;
  float* __restrict scores = st.scores.data();
  for (int64_t g = 0; g < s.group; ++g) {
    const float* __restrict q = st.query.data() + g * dim;
    for (int64_t t = 0; t < count; ++t) {
      const C* __restrict k = keys + t * s.slot_stride;
      scores[g * s.block_size + t] = dot(q, k, dim);
    }
  }
}

void soft_cap_block(OnlineSoftmax& st, const DecodeShape& s, int64_t count) {
  const float cap = s.soft_cap, inv = 1.f / s.soft_cap;
  for (int64_t g = 0; g < s.group; ++g) {
    float* scores = st.scores.data() + g * s.block_size;
    for (int64_t t = 0; t < count; ++t) scores[t] = cap * std::tanh(scores[t] * inv);
  }
}

// Turns the block's scores into weights, rescaling what was accumulated before.
void softmax_block(OnlineSoftmax& st, const DecodeShape& s, int64_t count) {
  for (int64_t g = 0; g < s.group; ++g) {
    float* scores = st.scores.data() + g * s.block_size;
    const float new_max = std::max(st.max[g], max_of(scores, count));
    const float correction = fast_exp(st.max[g] - new_max);
#pragma omp simd
    for (int64_t t = 0; t < count; ++t) scores[t] = fast_exp(scores[t] - new_max);
    st.sum[g] = st.sum[g] * correction + sum(scores, count);
    st.max[g] = new_max;
    float* acc = st.acc.data() + g * s.head_dim;
#pragma omp simd
    for (int64_t i = 0; i < s.head_dim; ++i) acc[i] *= correction;
  }
}

template <typename C, int HD>
void accumulate_values(OnlineSoftmax& st, const DecodeShape& s, const C* values, int64_t count) {
  const int64_t dim = HD > 0 ? HD : s.head_dim;
  const float* __restrict scores = st.scores.data();
  for (int64_t g = 0; g < s.group; ++g) {
    float* __restrict acc = st.acc.data() + g * dim;
    for (int64_t t = 0; t < count; ++t) {
      const C* __restrict v = values + t * s.slot_stride;
      const float weight = scores[g * s.block_size + t];
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) acc[i] += weight * to_float(v[i]);
    }
  }
}


// The fast path, for head sizes and block sizes that are multiples of 16: the context goes
// 16 tokens at a time; each query head's 16 scores come out of one `transpose_add`, and
// the next 16 tokens' keys and values are prefetched (blocks are scattered in memory).
constexpr int64_t kChunk = 16;
constexpr int64_t kMaxGroup = 16;

template <typename T>
void prefetch_rows(const T* rows, int64_t count, int64_t stride, int64_t row_bytes) {
  for (int64_t t = 0; t < count; ++t) {
    const char* row = reinterpret_cast<const char*>(rows + t * stride);
    for (int64_t byte = 0; byte < row_bytes; byte += 64) __builtin_prefetch(row + byte);
  }
}

template <typename T, typename C, int HD, bool SoftCap>
struct ChunkedDecode {
  static constexpr int kVecs = HD / 16;
  const DecodeShape& s;
  vec16 query[kMaxGroup][kVecs], acc[kMaxGroup][kVecs];
  float max[kMaxGroup], sum[kMaxGroup];
  vec16 lane_sums[kMaxGroup];  // the weights' sums lane by lane, folded into sum by finish()
  alignas(64) float weights[kMaxGroup][kChunk];

  // `sinks`: the group's sink logits (nullptr: none).
  ChunkedDecode(const DecodeShape& shape, const T* q, const float* sinks) : s(shape) {
    for (int64_t g = 0; g < s.group; ++g) {
#pragma GCC unroll 16
      for (int c = 0; c < kVecs; ++c) {
        query[g][c] = load16(q + g * s.q_head_stride + 16 * c) * s.scale;
        acc[g][c] = vec16{};
      }
      max[g] = sinks ? sinks[g] : -std::numeric_limits<float>::infinity();
      sum[g] = sinks ? 1.f : 0.f;
      lane_sums[g] = vec16{};
    }
  }

  void scores(const C* keys, int64_t count) {
    vec16 rows[kMaxGroup][kChunk];
    for (int64_t t = 0; t < kChunk; ++t) {
      if (t >= count) {
        for (int64_t g = 0; g < s.group; ++g) rows[g][t] = vec16{};
        continue;
      }
      vec16 key[kVecs];
#pragma GCC unroll 16
      for (int c = 0; c < kVecs; ++c) key[c] = load16(keys + t * s.slot_stride + 16 * c);
      for (int64_t g = 0; g < s.group; ++g) {
        vec16 partial = query[g][0] * key[0];
#pragma GCC unroll 16
        for (int c = 1; c < kVecs; ++c) partial += query[g][c] * key[c];
        rows[g][t] = partial;
      }
    }
    const ivec16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int64_t g = 0; g < s.group; ++g) {
      vec16 score = transpose_add(rows[g]);
      if constexpr (SoftCap) score = tanh16(score * (1.f / s.soft_cap)) * s.soft_cap;
      score = lane < static_cast<int32_t>(count) ? score : splat16(-std::numeric_limits<float>::infinity());
      if (above(score, max[g])) rescale(g, std::max(max[g], max16(score)));
      const vec16 weight = exp16(score - max[g]);
      lane_sums[g] += weight;
      store16(weights[g], weight);
    }
  }

  // Does any lane of `score` pass `max`? Most chunks after the first few: none, and then
  // the running max, sum and sums stay as they are (a correction of exp(0) = 1 exactly).
  static bool above(vec16 score, float max) {
#if defined(__AVX512F__)
    const __m512 lanes = reinterpret_cast<const __m512&>(score);
    return _mm512_cmp_ps_mask(lanes, _mm512_set1_ps(max), _CMP_GT_OQ) != 0;
#else
    return max16(score) > max;
#endif
  }

  // Query head g's running max becomes `new_max`: what it summed so far scaled to it.
  void rescale(int64_t g, float new_max) {
    const float correction = fast_exp(max[g] - new_max);
    sum[g] *= correction;
    lane_sums[g] *= correction;
    max[g] = new_max;
#pragma GCC unroll 16
    for (int c = 0; c < kVecs; ++c) acc[g][c] *= correction;
  }

  // Up to kBlock query heads at a time, their sums in registers across the chunk's keys,
  // each value row loaded once for all of them (a head at a time loaded it once per head;
  // with the heads innermost at a runtime count, the sums stayed in memory: a load, FMA
  // and store per update). Each head's additions in the same order as one at a time.
  static constexpr int kBlock = kVecs >= 16 ? 1 : 16 / kVecs;

  template <int N>
  void value_block(const C* values, int64_t count, int64_t first) {
    vec16 sums[N][kVecs];
#pragma GCC unroll 16
    for (int n = 0; n < N; ++n) {
#pragma GCC unroll 16
      for (int c = 0; c < kVecs; ++c) sums[n][c] = acc[first + n][c];
    }
    for (int64_t t = 0; t < count; ++t) {
      vec16 row[kVecs];
#pragma GCC unroll 16
      for (int c = 0; c < kVecs; ++c) row[c] = load16(values + t * s.slot_stride + 16 * c);
#pragma GCC unroll 16
      for (int n = 0; n < N; ++n) {
        const vec16 weight = splat16(weights[first + n][t]);
#pragma GCC unroll 16
        for (int c = 0; c < kVecs; ++c) sums[n][c] += weight * row[c];
      }
    }
#pragma GCC unroll 16
    for (int n = 0; n < N; ++n) {
#pragma GCC unroll 16
      for (int c = 0; c < kVecs; ++c) acc[first + n][c] = sums[n][c];
    }
  }

  template <int N = kBlock>
  void value_rest(const C* values, int64_t count, int64_t first, int64_t left) {
    if constexpr (N > 0) {
      if (left == N) return value_block<N>(values, count, first);
      value_rest<N - 1>(values, count, first, left);
    }
  }

  void values(const C* values, int64_t count) {
    int64_t g = 0;
    for (; g + kBlock <= s.group; g += kBlock) value_block<kBlock>(values, count, g);
    value_rest(values, count, g, s.group - g);
  }

  // The running sums, whole: each head's lane sums added up once, after the last chunk.
  void finish() {
    for (int64_t g = 0; g < s.group; ++g) sum[g] += tree_sum16(lane_sums[g]);
  }

  // Query head g's row times `scale(g)`, head dimensions in order, into `out`.
  template <typename Out, typename Scale>
  void put_rows(Out* out, Scale scale) const {
    for (int64_t g = 0; g < s.group; ++g) {
      const float factor = scale(g);
      alignas(64) float row[HD];
#pragma GCC unroll 16
      for (int c = 0; c < kVecs; ++c) store16(row + 16 * c, acc[g][c] * factor);
      for (int64_t i = 0; i < HD; ++i) out[g * HD + i] = from_float<Out>(row[i]);
    }
  }
};

// The 16-token path of this build: vec16 registers on AVX-512, native-width ones elsewhere.
#if defined(__AVX512F__)
template <typename T, typename C, int HD, bool SoftCap>
using FastDecode = ChunkedDecode<T, C, HD, SoftCap>;
#else
template <typename T, typename C, int HD, bool SoftCap>
using FastDecode = NarrowDecode<DecodeShape, T, C, HD, kMaxGroup, kChunk, SoftCap>;
#endif

// What one task reads and writes: KV heads first_head.. (`heads` of them) of one sequence.
template <typename T, typename C>
struct DecodeWalk {
  const T* query;          // the sequence's query token
  const C *keys, *values;  // the cache's key and value base at first_head
  const int32_t* table;
  int64_t seq_len;
  const float* sinks;  // all heads' sinks, or nullptr
  T* out;              // the sequence's output token
  int64_t first_head, heads;

  // KV head first_head + h's pieces: its group's query heads, sinks and outputs.
  const T* query_of(const DecodeShape& s, int64_t h) const {
    return query + (first_head + h) * s.group * s.q_head_stride;
  }
  const float* sinks_of(const DecodeShape& s, int64_t h) const {
    return sinks ? sinks + (first_head + h) * s.group : nullptr;
  }
  T* out_of(const DecodeShape& s, int64_t h) const { return out + (first_head + h) * s.group * s.head_dim; }
};

// The context positions a walk (or one part of a split walk) reads: [from, to).
struct KeyRange {
  int64_t from, to;
};

// A split walk's part, unnormalised (merge_shares adds the parts up): the group's rows
// (group x head_dim), then each query head's running max, then its sum.
struct Share {
  float* data;
  float* rows() const { return data; }
  float* max(const DecodeShape& s) const { return data + s.group * s.head_dim; }
  float* sum(const DecodeShape& s) const { return data + s.group * (s.head_dim + 1); }
  static int64_t floats(const DecodeShape& s) { return s.group * (s.head_dim + 2); }
};

// Chunks end on multiples of 16 (so never straddle a block); a window's first chunk starts
// at its first visible position and is shorter. The task's KV heads go chunk by chunk
// together, each prefetching its rows of the next chunk: their rows of a slot are
// adjacent, so the walk reads the cache as one stream. On a Zen 5 VM (2 threads), reading
// a 256-byte row of every 768 bytes ran at 20-22 GB/s and whole rows at 34-37; fp32 decode
// of 16 x 1,536 (3 KV heads) took 1.02-1.08 ms this way, 1.20-1.32 one head at a time.
// `share`: a part of a split walk (one KV head) keeps its unnormalised result there; only
// the first part starts from the sinks.
template <typename State, typename T, typename C>
void attend_chunked(const DecodeShape& s, const DecodeWalk<T, C>& w, KeyRange keys, bool with_sinks,
                    const Share* share) {
  std::vector<State> states;
  states.reserve(w.heads);
  for (int64_t h = 0; h < w.heads; ++h) {
    states.emplace_back(s, w.query_of(s, h), with_sinks ? w.sinks_of(s, h) : nullptr);
  }
  const int64_t row_bytes = s.head_dim * static_cast<int64_t>(sizeof(C));
  CacheCursor cursor(s, keys.from);
  for (int64_t start = keys.from, end; start < keys.to; start = end) {
    end = std::min(keys.to, (start / kChunk + 1) * kChunk);
    const int64_t count = end - start, offset = cursor.offset(s, w.table);
    cursor.advance(s, count);
    const int64_t next_count = std::min(kChunk, keys.to - end);
    const int64_t next = next_count > 0 ? cursor.offset(s, w.table) : 0;  // the table may end here
    for (int64_t h = 0; h < w.heads; ++h) {
      const int64_t head = h * s.head_dim;
      if (next_count > 0) {
        prefetch_rows(w.keys + head + next, next_count, s.slot_stride, row_bytes);
        prefetch_rows(w.values + head + next, next_count, s.slot_stride, row_bytes);
      }
      states[h].scores(w.keys + head + offset, count);
      states[h].values(w.values + head + offset, count);
    }
  }
  if constexpr (requires(State& state) { state.finish(); }) {
    for (State& state : states) state.finish();
  }
  if (share == nullptr) {
    for (int64_t h = 0; h < w.heads; ++h) {
      const float* sums = states[h].sum;
      states[h].put_rows(w.out_of(s, h), [&](int64_t g) { return normaliser(s, sums[g]); });
    }
    return;
  }
  states[0].put_rows(share->rows(), [](int64_t) { return 1.f; });  // unnormalised
  std::copy(states[0].max, states[0].max + s.group, share->max(s));
  std::copy(states[0].sum, states[0].sum + s.group, share->sum(s));
}

// Block by block from the block holding the first visible position (read from there on).
template <typename T, typename C, int HD>
void attend_one(const DecodeShape& s, const T* query, const C* keys, const C* values, const int32_t* table,
                int64_t seq_len, const float* sinks, T* out) {
  OnlineSoftmax st(s, sinks);
  for (int64_t g = 0; g < s.group; ++g) {
    const T* q = query + g * s.q_head_stride;
    for (int64_t i = 0; i < s.head_dim; ++i) st.query[g * s.head_dim + i] = to_float(q[i]) * s.scale;
  }
  const int64_t first = first_visible(s, seq_len);
  for (int64_t b = first / s.block_size, start = first; start < seq_len; ++b) {
    const int64_t end = std::min(seq_len, (b + 1) * s.block_size), count = end - start;
    const int64_t offset = (static_cast<int64_t>(table[b]) * s.block_size + start - b * s.block_size) * s.slot_stride;
    score_block<C, HD>(st, s, keys + offset, count);
    if (s.soft_cap > 0.f) soft_cap_block(st, s, count);
    softmax_block(st, s, count);
    accumulate_values<C, HD>(st, s, values + offset, count);
    start = end;
  }
  for (int64_t g = 0; g < s.group; ++g) {
    const float inv = normaliser(s, st.sum[g]);
    for (int64_t i = 0; i < s.head_dim; ++i) out[g * s.head_dim + i] = from_float<T>(st.acc[g * s.head_dim + i] * inv);
  }
}

void check_inputs(const at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens) {
  check_cpu(query, "paged_decode_attention: query");
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1, "paged_decode_attention: query must be [seqs, heads, head_dim]");
  TORCH_CHECK(out.sizes() == query.sizes() && out.is_contiguous(), "paged_decode_attention: out must be contiguous like query");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.is_contiguous() && kv_cache.size(0) == 2 && kv_cache.size(4) == query.size(2),
              "paged_decode_attention: kv_cache must be contiguous [2, blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(out.scalar_type() == query.scalar_type(), "paged_decode_attention: query and out must share a dtype");
  TORCH_CHECK(kv_cache.scalar_type() == query.scalar_type() || is_fp8_cache(kv_cache.scalar_type()),
              "paged_decode_attention: kv_cache must have the query's dtype or be float8 (e4m3fn / e5m2)");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.is_contiguous() && block_tables.size(0) == query.size(0),
              "paged_decode_attention: block_tables must be int32 [seqs, max_blocks]");
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() && seq_lens.numel() == query.size(0),
              "paged_decode_attention: seq_lens must be int32 [seqs]");
}

// Whether the 16-key chunk walk (attend_chunked) serves this shape; else attend_one.
template <int HD>
bool chunked_walk(const DecodeShape& s) {
  return HD > 0 && HD % 16 == 0 && s.block_size % kChunk == 0 && s.group <= kMaxGroup;
}

// Whether bf16 walks of this shape run on AMX tiles (decode_attention_amx.h).
template <typename T, typename C, int HD>
bool amx_walk(const DecodeShape& s) {
  constexpr bool bf16 = std::is_same_v<T, bf16_bits> && std::is_same_v<C, bf16_bits>;
  return bf16 && HD % 32 == 0 && chunked_walk<HD>(s) && s.bf16_dot && amx_enabled();
}

// `amx`: amx_walk's answer, read once a call.
template <typename T, typename C, int HD>
void attend(const DecodeShape& s, const DecodeWalk<T, C>& w, KeyRange keys, bool with_sinks, const Share* share,
            bool amx) {
  constexpr int kHD = HD > 0 ? HD : 16;
  if (chunked_walk<HD>(s)) {
#if defined(OCTAVO_HAS_AMX)
    if constexpr (std::is_same_v<T, bf16_bits> && std::is_same_v<C, bf16_bits> && HD % 32 == 0) {
      if (amx) {
        if (s.soft_cap > 0.f) {
          return attend_chunked<AmxDecode<DecodeShape, kHD, kMaxGroup, kChunk, true>>(s, w, keys, with_sinks, share);
        }
        return attend_chunked<AmxDecode<DecodeShape, kHD, kMaxGroup, kChunk, false>>(s, w, keys, with_sinks, share);
      }
    }
#endif
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, bf16_bits> && std::is_same_v<C, bf16_bits> && HD % 32 == 0) {
      if (s.bf16_dot) {
        if (s.soft_cap > 0.f) {
          return attend_chunked<Bf16Decode<DecodeShape, kHD, kMaxGroup, kChunk, true>>(s, w, keys, with_sinks, share);
        }
        return attend_chunked<Bf16Decode<DecodeShape, kHD, kMaxGroup, kChunk, false>>(s, w, keys, with_sinks, share);
      }
    }
#endif
    if (s.soft_cap > 0.f) return attend_chunked<FastDecode<T, C, kHD, true>>(s, w, keys, with_sinks, share);
    return attend_chunked<FastDecode<T, C, kHD, false>>(s, w, keys, with_sinks, share);
  }
  for (int64_t h = 0; h < w.heads; ++h) {
    attend_one<T, C, HD>(s, w.query_of(s, h), w.keys + h * s.head_dim, w.values + h * s.head_dim, w.table, w.seq_len,
                         w.sinks_of(s, h), w.out_of(s, h));
  }
}

// A task walks all of a sequence's KV heads where there are this many sequences per thread
// to share out; else one (sequence, KV head) pair, so a few long sequences still use every
// thread. AMX walks always take one KV head: each head's state (its span's tiles and
// buffers, about 30 KB at 64 dims) then stays in L1; 16 x 1,536 keys (9 heads over 3 of
// 64, the Intel Xeon's 2 threads) ran 0.81-0.85 ms with the heads together, 0.74 apart.
constexpr int64_t kWholeSequencesPerThread = 4;
// Fewer (sequence, KV head) walks than this per thread, and not a multiple of the threads:
// each walk is split into parts of at least kMinPartKeys keys, walked by any thread, then
// merged (vLLM's split-K decode). One sequence of 3 KV heads on 2 threads otherwise keeps
// one thread busy twice as long as the other: split in two, each thread walks 3 parts.
constexpr int64_t kSplitBelowTasksPerThread = 4;
constexpr int64_t kMinPartKeys = 128;

// The fewest parts (>= 2) that share the walks out evenly, as long as parts keep
// kMinPartKeys keys of the longest walk; 1 where the walks already share out.
int64_t parts_per_walk(int64_t walks, int64_t threads, int64_t longest) {
  if (threads < 2 || walks % threads == 0 || walks >= kSplitBelowTasksPerThread * threads) return 1;
  const int64_t most = longest / kMinPartKeys;
  int64_t parts = 2;
  while (parts < most && walks * parts % threads != 0) ++parts;
  return std::min(parts, std::max<int64_t>(1, most));
}

// Part `part` of `parts` of a walk's visible keys: equal runs of whole 16-key chunks.
KeyRange part_range(const DecodeShape& s, int64_t seq_len, int64_t parts, int64_t part) {
  const int64_t first = first_visible(s, seq_len);
  const int64_t size = ((seq_len - first + parts - 1) / parts + kChunk - 1) / kChunk * kChunk;
  const int64_t from = std::min(seq_len, first + part * size);
  return {from, std::min(seq_len, from + size)};
}

// A split walk's output: its parts' rows and sums, each rescaled to the largest max.
template <typename T>
void merge_shares(const DecodeShape& s, float* shares, int64_t parts, T* out) {
  const int64_t stride = Share::floats(s);
  std::vector<float> row(s.head_dim);
  for (int64_t g = 0; g < s.group; ++g) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < parts; ++p) top = std::max(top, Share{shares + p * stride}.max(s)[g]);
    std::fill(row.begin(), row.end(), 0.f);
    float total = 0.f;
    for (int64_t p = 0; p < parts; ++p) {
      const Share part{shares + p * stride};
      if (part.max(s)[g] == -std::numeric_limits<float>::infinity()) continue;  // saw nothing
      const float weight = std::exp(part.max(s)[g] - top);
      total += part.sum(s)[g] * weight;
      for (int64_t i = 0; i < s.head_dim; ++i) row[i] += part.rows()[g * s.head_dim + i] * weight;
    }
    const float inv = normaliser(s, total);
    for (int64_t i = 0; i < s.head_dim; ++i) out[g * s.head_dim + i] = from_float<T>(row[i] * inv);
  }
}

template <typename T, typename C, int HD>
void run_decode(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache, const int32_t* tables,
                const int32_t* lens, const DecodeShape& s) {
  const int64_t seqs = query.size(0), num_slots = kv_cache.size(1) * kv_cache.size(2);
  const C* keys = ptr<C>(kv_cache);
  const C* values = keys + num_slots * s.slot_stride;
  const T* q = ptr<T>(query);
  T* o = ptr<T>(out);
  const int64_t threads = at::get_num_threads();
  const bool amx = amx_walk<T, C, HD>(s);
  const bool whole = seqs >= kWholeSequencesPerThread * threads && !amx;
  const int64_t heads = whole ? s.kv_heads : 1, tasks_per_seq = s.kv_heads / heads, walks = seqs * tasks_per_seq;
  const auto walk_of = [&](int64_t item) {
    const int64_t b = item / tasks_per_seq, first_head = item % tasks_per_seq * heads;
    const int64_t head_offset = first_head * s.head_dim;
    return DecodeWalk<T, C>{q + b * s.q_token_stride, keys + head_offset, values + head_offset,
                            tables + b * s.max_blocks, lens[b], s.sinks, o + b * s.heads * s.head_dim,
                            first_head, heads};
  };
  const int64_t longest = seqs > 0 ? *std::max_element(lens, lens + seqs) : 0;
  const int64_t parts = chunked_walk<HD>(s) ? parts_per_walk(walks, threads, longest) : 1;
  if (parts == 1) {
    // The query heads of a KV head share every key and value read.
    const auto attend_walk = [&](int64_t item) {
      const DecodeWalk<T, C> walk = walk_of(item);
      attend<T, C, HD>(s, walk, {first_visible(s, walk.seq_len), walk.seq_len}, true, nullptr, amx);
    };
    if (seqs < threads) {
      at::parallel_for(0, walks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) attend_walk(item);
      });
      return;
    }
    // Thread t takes sequences t, t + threads, ... (all their walks, whose cache rows lie
    // side by side): a batch padded up to a decode graph's size ends in rows of one key,
    // which contiguous ranges would leave to the last thread alone.
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t first = begin; first < end; ++first) {
        for (int64_t b = first; b < seqs; b += threads) {
          for (int64_t task = 0; task < tasks_per_seq; ++task) attend_walk(b * tasks_per_seq + task);
        }
      }
    });
    return;
  }
  std::vector<float> shares(walks * parts * Share::floats(s));
  at::parallel_for(0, walks * parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const DecodeWalk<T, C> walk = walk_of(item / parts);
      const int64_t part = item % parts;
      const Share share{shares.data() + item * Share::floats(s)};
      attend<T, C, HD>(s, walk, part_range(s, walk.seq_len, parts, part), part == 0, &share, amx);
    }
  });
  for (int64_t item = 0; item < walks; ++item) {
    merge_shares(s, shares.data() + item * parts * Share::floats(s), parts, walk_of(item).out_of(s, 0));
  }
}

}  // namespace

void paged_decode_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale, double k_scale,
                            double v_scale, int64_t window, double soft_cap, const c10::optional<at::Tensor>& sinks) {
  check_inputs(out, query, kv_cache, block_tables, seq_lens);
  const float* sink_data = check_attention_options(query, window, soft_cap, sinks, "paged_decode_attention");
  const DecodeShape s = attention_shape(query, kv_cache, block_tables, scale, k_scale, v_scale, window, soft_cap,
                                      sink_data, "paged_decode_attention");
  const int64_t seqs = query.size(0);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < seqs; ++b) {
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= s.max_blocks * s.block_size, "paged_decode_attention: seq_len out of range");
  }
  dispatch_float_bf16(query.scalar_type(), "paged_decode_attention", [&]<typename T>() {
    dispatch_cache<T>(kv_cache.scalar_type(), [&]<typename C>() {
      switch (s.head_dim) {
        case 64: return run_decode<T, C, 64>(out, query, kv_cache, tables, lens, s);
        case 80: return run_decode<T, C, 80>(out, query, kv_cache, tables, lens, s);
        case 96: return run_decode<T, C, 96>(out, query, kv_cache, tables, lens, s);
        case 128: return run_decode<T, C, 128>(out, query, kv_cache, tables, lens, s);
        case 256: return run_decode<T, C, 256>(out, query, kv_cache, tables, lens, s);
        default: return run_decode<T, C, 0>(out, query, kv_cache, tables, lens, s);
      }
    });
  });
}

}  // namespace octavo_cpu
