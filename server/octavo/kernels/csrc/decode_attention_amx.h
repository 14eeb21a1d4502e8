// Decode attention on AMX tiles (amx_tiles.h), for bf16 queries over a bf16 cache: the
// walk (attend_chunked) hands over 16-key chunks, and this state keeps up to four of them
// and runs them as one span of 64 keys, so the tile instructions work span by span:
//   - scores: a chunk's 16 key rows straight from the cache block (A: a key per row, 32
//     dims) times the group's queries as pairs of dims (B: a pair per row, a query head per
//     column), into 16 keys x group heads; each head's scores read down its column;
//   - the span's online softmax: one max and one rescale per head per span, the weights
//     rounded to bf16 (as the vdpbf16ps path and torch's CPU flash attention do);
//   - weighted sums: the weights (A: a head per row, 32 keys) times the value rows two keys
//     at a time (B: interleaved as the vdpbf16ps path interleaves them, 16 dims a tile),
//     summed over the span in the tiles and added to the fp32 accumulators once a span.
// The accumulators, sinks and output order are the vdpbf16ps state's (decode_attention_bf16.h).
// A chunk shorter than 16 keys (a window's first, a sequence's last) has its rows copied
// into a zeroed buffer first: 16 rows from a window's first key may run past its cache
// block, and a stale value row times a zero weight could still be NaN.
// Worked through a chunk at a time, the tiles' latency went unhidden (the same products
// took as long as the vdpbf16ps path). By the span, on the Intel Xeon with AMX (bf16, 9
// query heads over 3 KV heads of 64): one thread over 4,096 keys in L2, 20 -> 13 ns a key
// and KV head; two threads over 16 x 1,536 keys, 0.94-1.10 -> 0.74-0.76 ms (vLLM's AMX
// kernel 0.54-0.59 on its own sequential cache), 64 x 300 keys 0.78 -> 0.63 ms.
#pragma once

#include "amx_tiles.h"
#include "decode_attention_bf16.h"

#if defined(OCTAVO_HAS_AMX)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace octavo_cpu {

template <typename Shape, int HD, int MaxGroup, int Chunk, bool SoftCap>
struct AmxDecode : Bf16Decode<Shape, HD, MaxGroup, Chunk, SoftCap> {
  using Base = Bf16Decode<Shape, HD, MaxGroup, Chunk, SoftCap>;
  using Base::acc;
  using Base::kRegs;
  using Base::max;
  using Base::s;
  using Base::sum;
  static_assert(Chunk == 16 && MaxGroup <= 16, "a chunk is one tile of keys; a tile row holds the group's heads");
  static constexpr int kChunks = 4, kSpan = kChunks * Chunk, kDimTiles = HD / 16;

  // A chunk kept for the span: its key and value rows and their stride (in bf16 numbers).
  struct Rows {
    const uint16_t *keys, *values;
    int64_t stride, count;
  };
  Rows chunks[kChunks];
  int pending = 0;
  alignas(64) uint32_t query_pairs[HD / 32][16][16];       // [c][p][g]: dims 32c + 2p, + 1 of head g
  alignas(64) uint16_t weights[MaxGroup][kSpan];           // bf16 bits, a head per row
  alignas(64) uint16_t short_rows[kChunks][2][Chunk][HD];  // short chunks' keys and values, zero-padded

  // What a span's work passes between tiles, shared by the thread's states (a walk of
  // several KV heads keeps one state each).
  struct Scratch {
    alignas(64) float scores_tile[kChunks][Chunk][16];                // a key per row, a head per column
    alignas(64) uint16_t value_pairs[kSpan / 32][kDimTiles][16][32];  // [32 keys][dim tile][key pair][16 dims x 2]
    alignas(64) float sums[2][16][16];                                // two tiles of weighted sums
  };
  static Scratch& scratch() {
    static thread_local Scratch shared;
    return shared;
  }

  // Tiles: 0 and 1 key rows (scores) or value pairs (sums); 2 query pairs; 3 and 4 scores;
  // 5 weights; 6 and 7 weighted sums.
  OCTAVO_AMX_TARGET AmxDecode(const Shape& shape, const uint16_t* q, const float* sinks) : Base(shape, q, sinks) {
    for (int64_t c = 0; c < HD / 32; ++c) {
      for (int64_t p = 0; p < 16; ++p) {
        for (int64_t g = 0; g < s.group; ++g) std::memcpy(&query_pairs[c][p][g], q + g * s.q_head_stride + 32 * c + 2 * p, 4);
      }
    }
    const int group = static_cast<int>(s.group);
    TileConfig config;
    for (int tile : {0, 1}) config.set(tile, 16, 64);
    for (int tile : {2, 3, 4}) config.set(tile, 16, 4 * group);
    for (int tile : {5, 6, 7}) config.set(tile, group, 64);
    load_tile_config(config);
  }

  OCTAVO_AMX_TARGET ~AmxDecode() { _tile_release(); }

  // Keeps the chunk's key rows (scored when the span is full or the walk ends).
  void scores(const uint16_t* keys, int64_t count) {
    const bool whole = count == Chunk;
    chunks[pending] = {whole ? keys : padded(keys, count, short_rows[pending][0]), nullptr, whole ? s.slot_stride : HD,
                       count};
  }

  void values(const uint16_t* values, int64_t count) {
    chunks[pending].values = count == Chunk ? values : padded(values, count, short_rows[pending][1]);
    if (++pending == kChunks) finish();
  }

  // Runs what is kept: call before reading the results.
  OCTAVO_AMX_TARGET void finish() {
    if (pending == 0) return;
    score_span();
    for (int64_t g = 0; g < s.group; ++g) weigh(g);
    interleave_values();
    add_weighted_sums();
    pending = 0;
  }

 private:
  const uint16_t* padded(const uint16_t* rows, int64_t count, uint16_t (*buffer)[HD]) const {
    std::memset(buffer, 0, sizeof(uint16_t) * Chunk * HD);
    for (int64_t t = 0; t < count; ++t) std::memcpy(buffer[t], rows + t * s.slot_stride, sizeof(uint16_t) * HD);
    return buffer[0];
  }

  // Two chunks at a time: tiles 3 and 4 sum their keys' products over the head's dims.
  OCTAVO_AMX_TARGET void score_span() {
    for (int i = 0; i < pending; i += 2) {
      const bool two = i + 1 < pending;
      _tile_zero(3);
      _tile_zero(4);
      for (int64_t c = 0; c < HD / 32; ++c) {
        _tile_loadd(2, query_pairs[c], 64);
        _tile_loadd(0, chunks[i].keys + 32 * c, chunks[i].stride * 2);
        _tile_dpbf16ps(3, 0, 2);
        if (two) {
          _tile_loadd(1, chunks[i + 1].keys + 32 * c, chunks[i + 1].stride * 2);
          _tile_dpbf16ps(4, 1, 2);
        }
      }
      _tile_stored(3, scratch().scores_tile[i], 64);
      if (two) _tile_stored(4, scratch().scores_tile[i + 1], 64);
    }
  }

  // Query head g's scores of the span into bf16 weights, its sums rescaled to a new max.
  OCTAVO_AMX_TARGET void weigh(int64_t g) {
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(16));
    const ivec16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const vec16 none = splat16(-std::numeric_limits<float>::infinity());
    vec16 scores[kChunks], tops = none;
    for (int i = 0; i < kChunks; ++i) {
      if (i >= pending) {
        scores[i] = none;
        continue;
      }
      const __m512 column = _mm512_i32gather_ps(rows, &scratch().scores_tile[i][0][g], 4);
      vec16 score = reinterpret_cast<const vec16&>(column) * s.scale;
      if constexpr (SoftCap) score = tanh16(score * (1.f / s.soft_cap)) * s.soft_cap;
      scores[i] = lane < static_cast<int32_t>(chunks[i].count) ? score : none;
      tops = tops > scores[i] ? tops : scores[i];
    }
    const float top = std::max(max[g], max16(tops));
    if (top != max[g]) {
      const float correction = fast_exp(max[g] - top);
      const __m512 factor = _mm512_set1_ps(correction);
      for (int c = 0; c < 2 * kRegs; ++c) acc[g][c] = _mm512_mul_ps(acc[g][c], factor);
      sum[g] *= correction;
      max[g] = top;
    }
    vec16 total{};
    for (int i = 0; i < kChunks; ++i) {
      const vec16 weight = exp16(scores[i] - top);
      total += weight;
      const __m256bh narrow = _mm512_cvtneps_pbh(reinterpret_cast<const __m512&>(weight));
      std::memcpy(&weights[g][Chunk * i], &narrow, sizeof(narrow));
    }
    sum[g] += tree_sum16(total);
  }

  // The span's value rows two keys at a time, each pair of registers interleaved as the
  // vdpbf16ps path does (unpacklo: tile 2c, unpackhi: 2c + 1); missing chunks are zeros.
  OCTAVO_AMX_TARGET void interleave_values() {
    for (int64_t pair = 0; pair < (pending * Chunk) / 2; ++pair) {
      const Rows& rows = chunks[2 * pair / Chunk];
      const uint16_t* first = rows.values + (2 * pair % Chunk) * rows.stride;
      uint16_t(*out)[16][32] = scratch().value_pairs[pair / 16];
      for (int c = 0; c < kRegs; ++c) {
        const __m512i a = _mm512_loadu_si512(first + 32 * c), b = _mm512_loadu_si512(first + rows.stride + 32 * c);
        _mm512_store_si512(out[2 * c][pair % 16], _mm512_unpacklo_epi16(a, b));
        _mm512_store_si512(out[2 * c + 1][pair % 16], _mm512_unpackhi_epi16(a, b));
      }
    }
    if (pending % 2 == 1) {  // the last 32 keys' second half: zero weights must meet zeros
      for (int j = 0; j < kDimTiles; ++j) std::memset(scratch().value_pairs[pending / 2][j][8], 0, 8 * 64);
    }
  }

  // Tiles 6 and 7: two tiles of dims, summed over the span's keys 32 at a time.
  OCTAVO_AMX_TARGET void add_weighted_sums() {
    const int steps = (pending + 1) / 2;
    Scratch& work = scratch();
    for (int j = 0; j < kDimTiles; j += 2) {
      _tile_zero(6);
      _tile_zero(7);
      for (int k = 0; k < steps; ++k) {
        _tile_loadd(5, &weights[0][32 * k], kSpan * 2);
        _tile_loadd(0, work.value_pairs[k][j], 64);
        _tile_dpbf16ps(6, 5, 0);
        _tile_loadd(1, work.value_pairs[k][j + 1], 64);
        _tile_dpbf16ps(7, 5, 1);
      }
      _tile_stored(6, work.sums[0], 64);
      _tile_stored(7, work.sums[1], 64);
      for (int64_t g = 0; g < s.group; ++g) {
        acc[g][j] = _mm512_add_ps(acc[g][j], _mm512_load_ps(work.sums[0][g]));
        acc[g][j + 1] = _mm512_add_ps(acc[g][j + 1], _mm512_load_ps(work.sums[1][g]));
      }
    }
  }
};

}  // namespace octavo_cpu
#endif  // OCTAVO_HAS_AMX
