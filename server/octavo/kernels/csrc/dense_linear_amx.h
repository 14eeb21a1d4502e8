// bf16 linears on AMX tiles (amx_tiles.h), on the same input-pair panels as the vdpbf16ps
// and widened paths (dense_linear_bf16.cpp): a panel's 16 input pairs are one B tile as
// stored (16 rows of 16 output columns x a pair, 64 bytes a row), so nothing is packed
// again. x's rows are copied once a call into A tiles (16 rows x 32 inputs, 1 KB each, zeros
// past the last row). The sums stay in fp32 tile registers
// over every input, then take the bias and are rounded to bf16 once.
//
// Eight tile registers: 0-3 the sums of 2 row tiles x 2 panels, 4-5 the row tiles, 6-7 the
// panels. Threads split the panel pairs; rows go in chunks of kAmxRowChunk, so that a
// chunk's A tiles stay in L2 while every panel passes (the weights are read once per
// chunk), and a thread's pairs go kAmxGroupPairs at a time, each row tile pair passing
// the whole group, so that output rows are written 512 bytes in a row. On the Intel Xeon
// (2 vCPUs), SmolLM2's linears at 2,048 rows (`octavo_bench cpu-linear`): 0.61x oneDNN's
// prepacked GEMM with a pair at a time, 0.80x with groups; 3,072 x 576 alone, one thread:
// 509 -> 786-893 GFLOP/s (oneDNN 1,021).
#pragma once

#include "amx_tiles.h"

#if defined(OCTAVO_HAS_AMX)
#include <ATen/Parallel.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "dense_panels.h"
#include "lanes.h"

namespace octavo_cpu::dense {

static_assert(kWidth == 16, "a panel is one B tile: 16 columns of pairs");

constexpr int64_t kAmxTileRows = 16;   // rows of x in an A tile
constexpr int64_t kAmxTilePairs = 16;  // input pairs in a tile (32 inputs, 64 bytes)
constexpr int64_t kAmxRowChunk = 512;  // rows whose tiles stay in L2 while all panels pass
constexpr int64_t kAmxGroupPairs = 8;  // panel pairs (their weights in L2) a row tile pair passes in turn

struct AmxLinearShape {
  int64_t rows, cols, depth, panels;  // depth: input pairs, a multiple of kAmxTilePairs
  const bf16_bits* tiles;             // x as row tiles: [row tiles, depth / 16, 16 rows, 32 inputs]
  const uint32_t* packed;             // [panels, depth, 16] weight pairs
  const bf16_bits* bias;              // nullptr: none
  bf16_bits* out;                     // [rows, cols]
};

// x's rows as tiles, each tile's 16 rows x 32 inputs one 1 KB block, a row tile's blocks in
// input order, rows past the last zero: every tile load reads 1 KB in a row, as the
// panels' do, where x's own rows put each tile's 16 lines a row apart.
inline void pack_row_tiles(const bf16_bits* x, int64_t x_stride, int64_t rows, int64_t depth, bf16_bits* tiles) {
  const int64_t steps = depth / kAmxTilePairs, row_tiles = (rows + kAmxTileRows - 1) / kAmxTileRows;
  constexpr int64_t kTileElements = kAmxTileRows * 2 * kAmxTilePairs;
  at::parallel_for(0, row_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      for (int64_t step = 0; step < steps; ++step) {
        bf16_bits* block = tiles + (tile * steps + step) * kTileElements;
        for (int64_t r = 0; r < kAmxTileRows; ++r) {
          const int64_t row = tile * kAmxTileRows + r;
          bf16_bits* dst = block + r * 2 * kAmxTilePairs;
          if (row < rows) {
            std::memcpy(dst, x + row * x_stride + step * 2 * kAmxTilePairs, 4 * kAmxTilePairs);
          } else {
            std::memset(dst, 0, 4 * kAmxTilePairs);
          }
        }
      }
    }
  });
}

// The sums of MT row tiles from `tile` by NT panels from `panel` over every input pair,
// into `sums` ([row tile * 2 + panel][16 rows][16 columns]).
template <int MT, int NT>
OCTAVO_AMX_TARGET void amx_block(const AmxLinearShape& s, int64_t tile, int64_t panel, float (&sums)[4][16][16]) {
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  if constexpr (MT > 1) _tile_zero(2);
  if constexpr (MT > 1 && NT > 1) _tile_zero(3);
  const bf16_bits* a = s.tiles + tile * s.depth * 2 * kAmxTileRows;
  const bf16_bits* a_next = a + s.depth * 2 * kAmxTileRows;
  const uint32_t* b = s.packed + panel * s.depth * kWidth;
  const uint32_t* b_next = b + s.depth * kWidth;
  for (int64_t k = 0; k < s.depth; k += kAmxTilePairs) {
    _tile_loadd(4, a + 2 * kAmxTileRows * k, 64);
    _tile_loadd(6, b + k * kWidth, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT > 1) {
      _tile_loadd(7, b_next + k * kWidth, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MT > 1) {
      _tile_loadd(5, a_next + 2 * kAmxTileRows * k, 64);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NT > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, sums[0], 64);
  if constexpr (NT > 1) _tile_stored(1, sums[1], 64);
  if constexpr (MT > 1) _tile_stored(2, sums[2], 64);
  if constexpr (MT > 1 && NT > 1) _tile_stored(3, sums[3], 64);
}

using AmxBlock = void (*)(const AmxLinearShape&, int64_t, int64_t, float (&)[4][16][16]);

inline AmxBlock amx_block_for(int64_t row_tiles, int64_t panels) {
  if (row_tiles > 1) return panels > 1 ? amx_block<2, 2> : amx_block<2, 1>;
  return panels > 1 ? amx_block<1, 2> : amx_block<1, 1>;
}

// A row tile's sums of one panel (16 rows x 16 columns from `col`), plus the bias, rounded
// to bf16 (vcvtneps2bf16: to nearest even, as torch rounds) into rows first_row.. of out.
OCTAVO_AMX_TARGET inline void amx_finish(const AmxLinearShape& s, const float (&sums)[16][16], int64_t first_row,
                                         int64_t col) {
  const int64_t rows = std::min(kAmxTileRows, s.rows - first_row);
  const int64_t width = std::min<int64_t>(kWidth, s.cols - col);
  const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1u);
  const __m512 bias = s.bias != nullptr ? std::bit_cast<__m512>(load_cols(s.bias, col, s.cols)) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_load_ps(sums[r]), bias));
    _mm256_mask_storeu_epi16(s.out + (first_row + r) * s.cols + col, mask, (__m256i)rounded);
  }
}

// Two row tiles from `tile` (one where the chunk ends) by the panel pair from `panel`.
OCTAVO_AMX_TARGET inline void amx_tiles_by_pair(const AmxLinearShape& s, int64_t panel, int64_t tile, int64_t end_tile) {
  alignas(64) float sums[4][16][16];
  const int64_t panels = std::min<int64_t>(2, s.panels - panel);
  const int64_t tiles = std::min<int64_t>(2, end_tile - tile);
  amx_block_for(tiles, panels)(s, tile, panel, sums);
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t p = 0; p < panels; ++p) amx_finish(s, sums[2 * t + p], (tile + t) * kAmxTileRows, (panel + p) * kWidth);
  }
}

// One thread's panel pairs begin..end over row tiles first_tile..end_tile, kAmxGroupPairs
// pairs at a time: a row tile pair passes each pair of the group in turn, so that its
// output rows are written kAmxGroupPairs * 64 bytes in a row (one panel pair at a time
// left 64 bytes per row and page: 25 % of the time at 2,048 rows x 3,072 columns).
OCTAVO_AMX_TARGET inline void amx_worker(const AmxLinearShape& s, int64_t begin, int64_t end, int64_t first_tile,
                                         int64_t end_tile) {
  const TileConfig config = full_tile_config();
  load_tile_config(config);
  for (int64_t group = begin; group < end; group += kAmxGroupPairs) {
    const int64_t group_end = std::min(end, group + kAmxGroupPairs);
    for (int64_t tile = first_tile; tile < end_tile; tile += 2) {
      for (int64_t pair = group; pair < group_end; ++pair) amx_tiles_by_pair(s, 2 * pair, tile, end_tile);
    }
  }
  _tile_release();
}

// out = x @ W.T + bias, x already in row tiles.
inline void run_amx_panels(const AmxLinearShape& s) {
  const int64_t pairs = (s.panels + 1) / 2;
  const int64_t row_tiles = (s.rows + kAmxTileRows - 1) / kAmxTileRows;
  const int64_t chunk_tiles = kAmxRowChunk / kAmxTileRows;
  for (int64_t first_tile = 0; first_tile < row_tiles; first_tile += chunk_tiles) {
    const int64_t end_tile = std::min(row_tiles, first_tile + chunk_tiles);
    at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) { amx_worker(s, begin, end, first_tile, end_tile); });
  }
}

}  // namespace octavo_cpu::dense
#endif  // OCTAVO_HAS_AMX
