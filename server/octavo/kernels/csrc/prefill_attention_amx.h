// Paged prefill attention's AMX tile, for bf16 queries over a bf16 cache where the CPU has
// AMX tiles (amx_tiles.h). The same lane-wise online softmax as the other tiles
// (prefill_attention.h), two lane groups a task (32 query rows of one sequence and KV
// head), keys a span of up to 64 at a time, both products on tile registers in the 2 x 2
// pattern (two A tiles, two B tiles, four independent sums: a chain of tile operations
// each waiting on the one before was most of the time with one sum tile):
//   - scores, transposed: 16 keys' rows straight from their cache block (16 keys never
//     span two blocks: they start at a multiple of 16 and blocks hold a multiple of 16)
//     times each group's queries as pairs of dimensions; a key's scores are a vec16 of a
//     group's rows, as the softmax wants them;
//   - weighted sums, transposed: the values transposed ([dims, positions], made once per
//     call for each sequence and KV head and shared by all its tasks) times each group's
//     weights as pairs of keys, rounded to bf16 (as torch's CPU flash attention rounds
//     them), added on the tiles to the accumulators, which are rescaled in memory first.
// The softmax's rescale, the loads of the accumulators and the drains of the tile unit
// come once a span, not once every 32 keys. The next span's scores go to the tiles between
// a span's weighing and its weighted sums, whose first tile loads read what the weighing
// just stored (in a profile they waited a quarter of the span's time for those stores; the
// order gained 2 % at 6,000 tokens: the wait mostly moved to the scores' first product).
#pragma once

#include "amx_tiles.h"
#include "prefill_attention.h"
#include "prefill_attention_bf16.h"

#if defined(OCTAVO_HAS_AMX)
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace octavo_cpu {
namespace prefill {

constexpr int64_t kAmxKeys = 32;   // keys a tile product covers: a span is whole products
constexpr int64_t kAmxSpan = 64;   // keys a span (a softmax step)
constexpr int64_t kAmxGroups = 2;  // lane groups a task

// Tile registers (all whole, full_tile_config): 0 and 1 the A tiles (16 keys' rows of 32
// dims; 16 dims' values of 32 keys), 2 and 3 the B tiles (one group's query pairs; one
// group's weight pairs), 4 to 7 the fp32 sums of each A tile with each B tile.
template <int HD>
struct AmxPrefillTile {
  static constexpr int64_t kTaskRows = kRows * kAmxGroups;

  alignas(64) uint32_t query[kAmxGroups][HD / 2][kRows];        // pair p of each row: dims 2p, 2p + 1
  alignas(64) float out[kAmxGroups][HD][kRows];                  // transposed accumulators
  alignas(64) uint32_t weights[kAmxGroups][kAmxSpan / 2][kRows];  // weights of keys 2i, 2i + 1 of each row
  SoftmaxLanesOf<kAmxSpan> lanes[kAmxGroups];
  const uint16_t* values = nullptr;  // this task's values transposed, [HD, values_stride]
  int64_t values_stride = 0;

  // Each group's queries as pairs of dims (padding rows zeros), turned 16 x 16 pairs at a
  // time in registers; the accumulators cleared.
  void start(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, const uint16_t* query_base) {
    for (int64_t g = 0; g < kAmxGroups; ++g) {
      const PrefillTask group = group_task(task, g);
      const float* rows[kRows];
      for (int64_t lane = 0; lane < kRows; ++lane) {
        const TileRow row = tile_row(s, seq, group, lane);
        const uint16_t* q = query_base + row.token * s.q_token_stride + row.head * s.q_head_stride;
        rows[lane] = row.valid ? reinterpret_cast<const float*>(q) : kZeroRow;
      }
      for (int64_t p = 0; p < HD / 2; p += 16) {
        __m512 columns[16];
        transpose_16x16(rows, p, columns);
        for (int64_t j = 0; j < 16; ++j) _mm512_store_ps(reinterpret_cast<float*>(query[g][p + j]), columns[j]);
      }
      lanes[g].start(s, seq, group);
    }
    std::memset(out, 0, sizeof(out));
  }

  // Tiles 4..7 += the A tiles at a0, a1 (rows `a_stride` bytes apart) times the B tiles
  // at b0, b1 (whole, 64-byte rows): 4 = a0 b0, 5 = a0 b1, 6 = a1 b0, 7 = a1 b1.
  OCTAVO_AMX_TARGET static void multiply_2x2(const void* a0, const void* a1, int64_t a_stride, const void* b0,
                                             const void* b1) {
    _tile_loadd(0, a0, a_stride);
    _tile_loadd(2, b0, kRows * 4);
    _tile_dpbf16ps(4, 0, 2);
    _tile_loadd(3, b1, kRows * 4);
    _tile_dpbf16ps(5, 0, 3);
    _tile_loadd(1, a1, a_stride);
    _tile_dpbf16ps(6, 1, 2);
    _tile_dpbf16ps(7, 1, 3);
  }

  // The scores of 32 keys whose two halves' 16 key rows start at `first` and `second` in
  // the cache, into each group's probs from key `t`.
  OCTAVO_AMX_TARGET void scores(const uint16_t* first, const uint16_t* second, int64_t key_stride, int64_t t) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t c = 0; c < HD / 32; ++c) {
      multiply_2x2(first + 32 * c, second + 32 * c, key_stride * 2, query[0][16 * c], query[1][16 * c]);
    }
    _tile_stored(4, &lanes[0].probs[t], kRows * 4);
    _tile_stored(5, &lanes[1].probs[t], kRows * 4);
    _tile_stored(6, &lanes[0].probs[t + 16], kRows * 4);
    _tile_stored(7, &lanes[1].probs[t + 16], kRows * 4);
  }

  // Each group's weights of the span's keys (0 past its count) as bf16 pairs of keys per
  // row, and its accumulators rescaled by `correction` (unless no row's max moved, as in
  // most spans of a long prompt).
  OCTAVO_AMX_TARGET void prepare_sums(int64_t g, const vec16& correction) {
    for (int64_t i = 0; i < kAmxSpan / 2; ++i) {
      _mm512_store_si512(weights[g][i], weight_pairs(lanes[g].probs[2 * i], lanes[g].probs[2 * i + 1]));
    }
    const __m512 factors = reinterpret_cast<const __m512&>(correction);
    if (_mm512_cmp_ps_mask(factors, _mm512_set1_ps(1.f), _CMP_EQ_OQ) == 0xFFFF) return;
    for (int64_t d = 0; d < HD; ++d) {
      vec16& acc = reinterpret_cast<vec16&>(out[g][d]);
      acc = acc * correction;
    }
  }

  // Both groups' weighted sums of dims 32b..32b + 31 over the span's first `steps` x 32
  // keys from `key`, added to their accumulators.
  OCTAVO_AMX_TARGET void weighted_sums(int64_t b, int64_t key, int64_t steps) {
    const int64_t stride = values_stride * 2;
    _tile_loadd(4, out[0][32 * b], kRows * 4);
    _tile_loadd(5, out[1][32 * b], kRows * 4);
    _tile_loadd(6, out[0][32 * b + 16], kRows * 4);
    _tile_loadd(7, out[1][32 * b + 16], kRows * 4);
    const uint16_t* v = values + 32 * b * values_stride + key;
    for (int64_t j = 0; j < steps; ++j, v += kAmxKeys) {
      multiply_2x2(v, v + 16 * values_stride, stride, weights[0][16 * j], weights[1][16 * j]);
    }
    _tile_stored(4, out[0][32 * b], kRows * 4);
    _tile_stored(5, out[1][32 * b], kRows * 4);
    _tile_stored(6, out[0][32 * b + 16], kRows * 4);
    _tile_stored(7, out[1][32 * b + 16], kRows * 4);
  }

  // Keys key..key + count (count <= kAmxSpan), their scores stored: the softmax, the
  // weights packed for the tiles and the accumulators rescaled. `probs` is free after.
  OCTAVO_AMX_TARGET void weigh(const PrefillShape& s, int64_t key, int64_t count, bool masked) {
    for (int64_t g = 0; g < kAmxGroups; ++g) prepare_sums(g, lanes[g].weigh(s, key, count, masked, s.scale));
  }

  // The weighted sums of the values of the keys weigh() took, added to the accumulators.
  OCTAVO_AMX_TARGET void add_weighted_sums(int64_t key, int64_t count) {
    const int64_t steps = (count + kAmxKeys - 1) / kAmxKeys;
    for (int64_t b = 0; b < HD / 32; ++b) weighted_sums(b, key, steps);
  }

  // Each group's accumulators turned back into rows, 16 x 16 blocks in registers, and
  // written (element by element, a column read per row: 1,536 tokens 3.59 -> 3.38 ms).
  void finish(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, uint16_t* out_base) const {
    alignas(64) float rows[kRows][HD];
    for (int64_t g = 0; g < kAmxGroups; ++g) {
      for (int64_t d = 0; d < HD; d += 16) {
        const float* dims[16];
        for (int64_t i = 0; i < 16; ++i) dims[i] = out[g][d + i];
        transpose_lanes(dims, 0, &rows[0][d], HD, 1.f);
      }
      const auto row_of = [&rows](int64_t lane, float*) -> const float* { return rows[lane]; };
      write_rows<HD>(lanes[g], s, seq, group_task(task, g), out_base, row_of);
    }
  }
};

}  // namespace prefill
}  // namespace octavo_cpu
#endif  // OCTAVO_HAS_AMX
