// bf16 linears (out = x @ W.T + bias: fp32 sums, the result rounded to bf16 as torch does)
// on weights packed once into column panels of input pairs: panel p holds, for each pair
// of input dimensions (2k, 2k + 1), output columns p * kWidth.. as (w[.][2k], w[.][2k + 1])
// pairs, [panels, ceil(in / 2), 2 * kWidth], zeros past the last column and the last input.
// The same layout runs three ways:
//   - with AMX tiles (chosen at run time, amx_tiles.h), from 2 rows where the inputs are a
//     multiple of 32: a panel's 16 input pairs are one B tile as stored
//     (dense_linear_amx.h);
//   - with AVX512_BF16 (chosen at run time, bf16_dot.h: on AMD, and for a single row on
//     Intel, whose cores run it at half the FMAs' rate): vdpbf16ps multiplies a pair of
//     inputs, broadcast, by a panel row of weight pairs and adds both products to each fp32
//     lane: one instruction per 32 multiply-adds;
//   - anywhere else (AVX-512 without it or on Intel from 2 rows, AVX2, generic): each
//     32-bit pair is widened, the even input's weight being its low half shifted up and the
//     odd's its high half masked, and the two go through FMAs against the inputs in fp32.
//     The odd input's product is added first, then the even's, in the order of Intel's
//     definition of vdpbf16ps; products of bf16 numbers are exact in fp32, so on an Intel
//     Xeon the two ways gave the same bf16 results (vdpbf16ps flushes denormals).
// The schedule (register blocks, L2 slices, threads) is dense_panels.h's, an input step
// being one pair. Where a row's inputs span more than one slice, the sums of the slices
// before the last wait in an fp32 buffer, so the result is rounded to bf16 once.
//
// SmolLM2-135M's linears of one step in bf16 (`python -m octavo_bench cpu-linear --dtype
// bfloat16`), 2 Zen 5 cores, weights read from memory, against oneDNN's prepacked bf16
// GEMM (what Octavo used before, and what vLLM's CPU build runs): 1 row 7.3 vs 8.9 ms,
// 2 rows 7.9 vs 8.8, 16 rows 10.1 vs 12.4, 32 rows 11.9 vs 15.8, 64 rows 22.6 vs 27.1,
// 256 rows 79.6 vs 78.7, 1,024 rows 353 vs 331. In cache, one core: 93 % of the vdpbf16ps
// peak at 256 x 576 x 3,072 (oneDNN 96 %). The AVX2 build (widened): 10.5 ms at 1 row,
// 15.1 at 8, 50.8 at 32, where oneDNN does not run bf16 and plain F.linear took 46 ms at
// 8 rows and 179 at 32.
// On an Intel Xeon with AMX (2 vCPUs, the same step; oneDNN runs its AMX GEMM there), AMX
// tiles from 2 rows, vdpbf16ps at 1: 1 row 16.5 vs 23.8 ms, 2 rows 16.8 vs 21.4, 16 rows
// 17.7 vs 23.5, 32 rows 21.9 vs 30.6, 64 rows 29.1 vs 34.5, 128 rows 45.2 vs 47.2, 256 rows
// 68.1 vs 57.0 (the 49,152-wide LM head, which a prefill runs on its last rows only, loses:
// 12.5 vs 8.6 ms alone), 1,024 rows 250 vs 244; vdpbf16ps alone took 56.1 ms at 32 rows.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>

#include "bf16_dot.h"
#include "common.h"
#include "dense_linear_amx.h"
#include "dense_panels.h"
#include "lanes.h"

#pragma GCC optimize("fp-contract=fast")

namespace octavo_cpu {
namespace {

using dense::load_cols;
using dense::store_cols;

typedef uint32_t pair_lanes __attribute__((vector_size(kWidth * sizeof(uint32_t))));
typedef uint16_t half_lanes __attribute__((vector_size(kWidth * sizeof(uint16_t))));

struct Bf16Shape {
  // When row blocks ask for the next slice (dense_panels.h), measured on SmolLM2's step: a
  // single block from 4 rows (1 row lost 10 %), and any number of blocks (2-4 % at 128-512
  // rows, 20-35 % at 16-64).
  static constexpr int64_t kAheadOneBlock = 4, kAheadMostBlocks = std::numeric_limits<int64_t>::max();
  int64_t rows, cols, depth, panels;  // depth: input pairs
  const bf16_bits* x;                 // bf16 inputs, an even count per row (the dot path)
  const float* x_float;               // the same in fp32 (the widening path)
  int64_t x_stride;                   // elements from one row of x (or x_float) to the next
  const uint32_t* packed;             // [panels, depth, kWidth] weight pairs
  const bf16_bits* bias;              // nullptr: none
  float* partial;                     // fp32 sums of the slices before the last
  bf16_bits* out;
};

// Rounded to the nearest even bf16 (NaN stays a quiet NaN), as from_float<bf16_bits>.
inline void store_bf16_cols(bf16_bits* row, int64_t first, int64_t cols, lanes_t value) {
  const pair_lanes bits = std::bit_cast<pair_lanes>(value);
  pair_lanes rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  rounded = value != value ? pair_lanes{} + 0x7FC0u : rounded;
  const half_lanes narrow = __builtin_convertvector(rounded, half_lanes);
  if (first + kWidth <= cols) {
    std::memcpy(row + first, &narrow, sizeof(narrow));
    return;
  }
  std::memcpy(row + first, &narrow, (cols - first) * sizeof(bf16_bits));
}

// The first slice starts from the bias (or zero), later ones from the fp32 buffer.
template <int MR, int NP>
inline void start_sums(const Bf16Shape& s, lanes_t (&acc)[MR][NP], int64_t row, int64_t panel, int64_t k0) {
  for (int p = 0; p < NP; ++p) {
    const int64_t col = (panel + p) * kWidth;
    const lanes_t start = s.bias != nullptr ? load_cols(s.bias, col, s.cols) : lanes_t{};
    for (int m = 0; m < MR; ++m) acc[m][p] = k0 == 0 ? start : load_cols(s.partial + (row + m) * s.cols, col, s.cols);
  }
}

// The last slice rounds its sums into `out`; earlier ones leave them in the fp32 buffer.
template <int MR, int NP>
inline void finish_sums(const Bf16Shape& s, const lanes_t (&acc)[MR][NP], int64_t row, int64_t panel, bool last) {
  for (int m = 0; m < MR; ++m) {
    for (int p = 0; p < NP; ++p) {
      const int64_t col = (panel + p) * kWidth;
      if (last) {
        store_bf16_cols(s.out + (row + m) * s.cols, col, s.cols, acc[m][p]);
      } else {
        store_cols(s.partial + (row + m) * s.cols, col, s.cols, acc[m][p]);
      }
    }
  }
}

// Rows row.. (MR) by panels panel.. (NP), input pairs k0..k0 + depth, widened to fp32 one
// panel at a time (two widened vectors live, not 2 * NP). With few sums (a block of 1 row)
// the odd inputs' products go to sums of their own: the two FMAs of a step into one sum
// would wait on each other (AVX2, one core, in cache: 57 -> 73-82 GB/s at 1 row).
template <int MR, int NP>
struct WidenedPanels {
  static constexpr bool kSplit = MR * NP <= 4;

  static void run(const Bf16Shape& s, int64_t row, int64_t panel, int64_t k0, int64_t depth, dense::Ahead ahead) {
    lanes_t acc[MR][NP], odd_acc[MR][NP] = {};
    start_sums(s, acc, row, panel, k0);
    const uint32_t* weights = s.packed + (panel * s.depth + k0) * kWidth;
    const float* x = s.x_float + row * s.x_stride + 2 * k0;
    for (int64_t k = 0; k < depth; ++k) {
      ahead.step();
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) {
        pair_lanes pairs;
        std::memcpy(&pairs, weights + p * s.depth * kWidth + k * kWidth, sizeof(pairs));
        const lanes_t even = std::bit_cast<lanes_t>(pairs << 16), odd = std::bit_cast<lanes_t>(pairs & 0xFFFF0000u);
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) (kSplit ? odd_acc : acc)[m][p] += splat_lanes(x[m * s.x_stride + 2 * k + 1]) * odd;
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) acc[m][p] += splat_lanes(x[m * s.x_stride + 2 * k]) * even;
      }
    }
    if constexpr (kSplit) {
      for (int m = 0; m < MR; ++m) {
        for (int p = 0; p < NP; ++p) acc[m][p] += odd_acc[m][p];
      }
    }
    finish_sums(s, acc, row, panel, k0 + depth == s.depth);
  }
};

#if defined(__AVX512F__)
// The same with vdpbf16ps: a pair of inputs broadcast against 16 weight pairs.
template <int MR, int NP>
struct DotPanels {
  OCTAVO_BF16_TARGET static void run(const Bf16Shape& s, int64_t row, int64_t panel, int64_t k0, int64_t depth, dense::Ahead ahead) {
    lanes_t acc[MR][NP];
    start_sums(s, acc, row, panel, k0);
    const uint32_t* weights = s.packed + (panel * s.depth + k0) * kWidth;
    const bf16_bits* x = s.x + row * s.x_stride + 2 * k0;
    for (int64_t k = 0; k < depth; ++k) {
      ahead.step();
      __m512i w[NP];
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) w[p] = _mm512_loadu_si512(weights + p * s.depth * kWidth + k * kWidth);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        int32_t pair;
        std::memcpy(&pair, x + m * s.x_stride + 2 * k, sizeof(pair));
        const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) acc[m][p] = _mm512_dpbf16_ps(acc[m][p], a, (__m512bh)w[p]);
      }
    }
    finish_sums(s, acc, row, panel, k0 + depth == s.depth);
  }
};
#endif

#if defined(OCTAVO_HAS_AMX)
// From this many rows the AMX tiles beat vdpbf16ps (SmolLM2's step, 2 vCPUs: 16.8 vs 19.0
// ms at 2 rows, 16.5 vs 15.3 at 1).
constexpr int64_t kAmxMinRows = 2;

bool amx_runs(int64_t rows, int64_t depth, bool bf16_instructions) {
  return bf16_instructions && rows >= kAmxMinRows && depth % dense::kAmxTilePairs == 0 && amx_enabled();
}

// out = x @ W.T + bias on AMX tiles (dense_linear_amx.h); x's inputs a multiple of 32.
void run_amx_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed, const bf16_bits* bias) {
  const int64_t rows = x.size(0), cols = out.size(1), depth = packed.size(1);
  const int64_t row_tiles = (rows + dense::kAmxTileRows - 1) / dense::kAmxTileRows;
  at::Tensor tiles = at::empty({row_tiles * dense::kAmxTileRows, 2 * depth}, x.options());
  bf16_bits* tile_bits = reinterpret_cast<bf16_bits*>(tiles.data_ptr<at::BFloat16>());
  dense::pack_row_tiles(reinterpret_cast<const bf16_bits*>(x.data_ptr<at::BFloat16>()), x.stride(0), rows, depth,
                        tile_bits);
  const dense::AmxLinearShape s{rows,
                                cols,
                                depth,
                                packed.size(0),
                                tile_bits,
                                reinterpret_cast<const uint32_t*>(packed.data_ptr<at::BFloat16>()),
                                bias,
                                reinterpret_cast<bf16_bits*>(out.data_ptr<at::BFloat16>())};
  dense::run_amx_panels(s);
}
#endif

void check_linear(const at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                  const c10::optional<at::Tensor>& bias) {
  const char* op = "dense_linear";
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.stride(1) == 1, op,
              ": x must be bfloat16 [rows, in] with unit column stride (the weight is bfloat16)");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous(), op, ": packed must come from pack_dense_weight");
  TORCH_CHECK(packed.size(2) == 2 * kWidth, op, ": packed for ", packed.size(2) / 2, "-lane panels, this build uses ",
              kWidth, " (pack with the same build)");
  TORCH_CHECK(packed.size(1) == (x.size(1) + 1) / 2, op, ": x has ", x.size(1), " inputs, the weight ",
              2 * packed.size(1), " (in pairs)");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(0),
              op, ": out must be contiguous bfloat16 [rows, out]");
  const int64_t cols = out.size(1);
  TORCH_CHECK(cols > (packed.size(0) - 1) * kWidth && cols <= packed.size(0) * kWidth, op,
              ": out's columns do not match the packed weight");
  TORCH_CHECK(!bias.has_value() || !bias->defined() ||
                  (bias->scalar_type() == at::kBFloat16 && bias->is_contiguous() && bias->numel() == cols),
              op, ": bias must be contiguous bfloat16 [out]");
}

}  // namespace

void pack_dense_weight_bf16(at::Tensor& packed, const at::Tensor& weight) {
  const char* op = "pack_dense_weight";
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2, op, ": weight must be a CPU matrix [out, in]");
  const int64_t cols = weight.size(0), depth = weight.size(1), pairs = (depth + 1) / 2;
  const int64_t panels = (cols + kWidth - 1) / kWidth;
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(0) == panels && packed.size(1) == pairs && packed.size(2) == 2 * kWidth,
              op, ": packed must be contiguous bfloat16 [ceil(out / width), ceil(in / 2), 2 * width]");
  const at::Tensor w = weight.contiguous();
  const bf16_bits* src = reinterpret_cast<const bf16_bits*>(w.data_ptr<at::BFloat16>());
  bf16_bits* dst = reinterpret_cast<bf16_bits*>(packed.data_ptr<at::BFloat16>());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t width = std::min<int64_t>(kWidth, cols - p * kWidth);
      bf16_bits* panel = dst + p * pairs * 2 * kWidth;
      if (width < kWidth || depth % 2) std::fill(panel, panel + pairs * 2 * kWidth, bf16_bits{0});
      for (int64_t j = 0; j < width; ++j) {
        const bf16_bits* row = src + (p * kWidth + j) * depth;
        for (int64_t k = 0; k < depth; ++k) panel[(k / 2) * 2 * kWidth + 2 * j + k % 2] = row[k];
      }
    }
  });
}

std::string dense_bf16_path(int64_t rows, int64_t in_features) {
#if defined(OCTAVO_HAS_AMX)
  if (amx_runs(rows, (in_features + 1) / 2, bf16_dot_enabled())) return "amx";
#endif
  return bf16_dot_for_rows(rows) ? "vdpbf16ps" : "widened";
}

void dense_linear_bf16(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                       const c10::optional<at::Tensor>& bias) {
  check_linear(out, x, packed, bias);
  const int64_t rows = x.size(0), cols = out.size(1), depth = packed.size(1);
  if (rows == 0) return;
  const bf16_bits* bias_bits =
      bias.has_value() && bias->defined() ? reinterpret_cast<const bf16_bits*>(bias->data_ptr<at::BFloat16>()) : nullptr;
#if defined(OCTAVO_HAS_AMX)
  if (amx_runs(rows, depth, bf16_dot_enabled())) return run_amx_linear(out, x, packed, bias_bits);
#endif
  const bool dot = bf16_dot_for_rows(rows);
  const at::Tensor inputs = x.size(1) % 2 ? at::constant_pad_nd(x, {0, 1}) : x;  // an even count: whole pairs
  const at::Tensor inputs_float = dot ? at::Tensor() : inputs.to(at::kFloat).contiguous();
  const at::Tensor partial = depth > dense::kDepth ? at::empty({rows, cols}, x.options().dtype(at::kFloat)) : at::Tensor();
  const Bf16Shape s{rows,
                    cols,
                    depth,
                    packed.size(0),
                    reinterpret_cast<const bf16_bits*>(inputs.data_ptr<at::BFloat16>()),
                    dot ? nullptr : inputs_float.data_ptr<float>(),
                    dot ? inputs.stride(0) : inputs_float.stride(0),
                    reinterpret_cast<const uint32_t*>(packed.data_ptr<at::BFloat16>()),
                    bias_bits,
                    partial.defined() ? partial.data_ptr<float>() : nullptr,
                    reinterpret_cast<bf16_bits*>(out.data_ptr<at::BFloat16>())};
#if defined(__AVX512F__)
  if (dot) return dense::run_panels<Bf16Shape, DotPanels>(s);
#endif
  dense::run_panels<Bf16Shape, WidenedPanels>(s);
}

}  // namespace octavo_cpu
