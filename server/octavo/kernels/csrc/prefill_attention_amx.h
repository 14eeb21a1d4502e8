// Paged prefill attention's AMX tile, for bf16 queries over a bf16 cache where the CPU has
// AMX tiles (amx_tiles.h). The same task (16 query rows of one sequence and KV head) and
// lane-wise online softmax as the other tiles (prefill_attention.h), with both products
// on tile registers:
//   - scores, transposed: 16 keys' rows straight from their cache block (16 keys never
//     span two blocks: they start at a multiple of 16 and blocks hold a multiple of 16)
//     times the queries as pairs of dimensions; 16 keys x 16 rows, one key's scores a vec16
//     of rows, as the softmax wants them;
//   - weighted sums, transposed: the values transposed ([dims, positions], made once per
//     call for each sequence and KV head and shared by all its tasks) times the weights as
//     pairs of keys, rounded to bf16 (as torch's CPU flash attention rounds them), into
//     16 dims x 16 rows, then added to the rescaled accumulators.
// Chunks are 32 keys (two score tiles, weighted sums over all 32 keys of a tile row):
// with 16, each chunk's chain of tile operations, every one waiting on the one before,
// took most of the time.
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

constexpr int64_t kAmxKeys = 32;  // keys per chunk: full tiles for the weighted sums

// Tile registers: 0 and 1 the scores of a chunk's two halves (a key per row, the 16 query
// rows, fp32), 2 keys (a key per row, 32 dims), 3 query pairs (a pair of dims per row, 16
// rows), 4 weight pairs (a pair of keys per row, 16 rows), 5 values (a dim per row, 32
// keys), 6 and 7 weighted sums of 16 dims each (a dim per row, 16 rows, fp32): all whole
// (full_tile_config).

template <int HD>
struct AmxPrefillTile {
  static constexpr int64_t kTaskRows = kRows;

  alignas(64) uint32_t query[HD / 2][kRows];        // pair p of each row: dims 2p (low half), 2p + 1
  alignas(64) float out[HD][kRows];                 // transposed accumulators
  alignas(64) float sums[2][16][kRows];             // one chunk's weighted sums of 32 dims
  alignas(64) uint32_t weights[kAmxKeys / 2][kRows];  // weights of keys 2i, 2i + 1 of each row
  SoftmaxLanesOf<kAmxKeys> lanes;
  const uint16_t* values = nullptr;  // this task's values transposed, [HD, values_stride]
  int64_t values_stride = 0;

  void start(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, const uint16_t* query_base) {
    for (int64_t lane = 0; lane < kRows; ++lane) {
      const TileRow row = tile_row(s, seq, task, lane);
      const uint16_t* q = query_base + row.token * s.q_token_stride + row.head * s.q_head_stride;
      for (int64_t p = 0; p < HD / 2; ++p) {
        uint32_t pair = 0;
        if (row.valid) std::memcpy(&pair, q + 2 * p, sizeof(pair));
        query[p][lane] = pair;
      }
      for (int64_t d = 0; d < HD; ++d) out[d][lane] = 0.f;
    }
    lanes.start(s, seq, task);
  }

  // The weights of the chunk's keys (0 past its count) as bf16 pairs of keys per row.
  OCTAVO_AMX_TARGET void pack_weights() {
    for (int64_t i = 0; i < kAmxKeys / 2; ++i) {
      _mm512_store_si512(weights[i], weight_pairs(lanes.probs[2 * i], lanes.probs[2 * i + 1]));
    }
  }

  // Starts the scores of the chunk whose two halves' 16 key rows start at `first` and
  // `second` in the cache.
  OCTAVO_AMX_TARGET void issue_scores(const uint16_t* first, const uint16_t* second, int64_t key_stride) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t c = 0; c < HD / 32; ++c) {
      _tile_loadd(3, query[16 * c], kRows * 4);
      _tile_loadd(2, first + 32 * c, key_stride * 2);
      _tile_dpbf16ps(0, 2, 3);
      _tile_loadd(2, second + 32 * c, key_stride * 2);
      _tile_dpbf16ps(1, 2, 3);
    }
  }

  // Keys key..key + count (count <= 32), their scores issued: the softmax, then the
  // weighted sums of their values.
  OCTAVO_AMX_TARGET void chunk(const PrefillShape& s, int64_t key, int64_t count, bool masked) {
    _tile_stored(0, &lanes.probs[0], kRows * 4);
    _tile_stored(1, &lanes.probs[16], kRows * 4);
    for (int64_t t = 0; t < count; ++t) lanes.probs[t] *= s.scale;
    const vec16 correction = lanes.weigh(s, key, count, masked);
    pack_weights();
    _tile_loadd(4, weights, kRows * 4);
    for (int64_t block = 0; block < HD / 16; block += 2) {
      weighted_sums(values + 16 * block * values_stride + key);
      for (int64_t j = 0; j < 32; ++j) {
        vec16& acc = reinterpret_cast<vec16&>(out[16 * block + j]);
        acc = acc * correction + reinterpret_cast<const vec16&>(sums[j / 16][j % 16]);
      }
    }
  }

  // Two blocks of 16 dims' weighted sums of the chunk into `sums`, from the transposed
  // values at `v`.
  OCTAVO_AMX_TARGET void weighted_sums(const uint16_t* v) {
    const int64_t stride = values_stride * 2;
    _tile_zero(6);
    _tile_zero(7);
    _tile_loadd(5, v, stride);
    _tile_dpbf16ps(6, 5, 4);
    _tile_loadd(5, v + 16 * values_stride, stride);
    _tile_dpbf16ps(7, 5, 4);
    _tile_stored(6, sums[0], kRows * 4);
    _tile_stored(7, sums[1], kRows * 4);
  }

  void finish(const PrefillShape& s, const PrefillSeq& seq, const PrefillTask& task, uint16_t* out_base) const {
    const auto row_of = [this](int64_t lane, float* buffer) -> const float* {
      for (int64_t d = 0; d < HD; ++d) buffer[d] = out[d][lane];
      return buffer;
    };
    write_rows<HD>(lanes, s, seq, task, out_base, row_of);
  }
};

}  // namespace prefill
}  // namespace octavo_cpu
#endif  // OCTAVO_HAS_AMX
