// fp32 linears (out = x @ W.T + bias) on weights packed once into column panels: panel p
// holds output columns p * kWidth.. for every input dimension, [panels, in, kWidth], zeros
// past the last column. One layout serves every row count:
//   - a few rows (decode) stream each panel once, front to back, a broadcast input element
//     against a vector of kWidth weights per FMA, several panels side by side;
//   - many rows (prefill) keep kBigRows x kBigPanels accumulators in registers while a
//     group of panels (a slice of kDepth input dimensions, in L2) serves every row block.
// Threads split the panel groups, and the rows too where the groups alone are too few.
//
// SmolLM2-135M's linears of one step in fp32 (30 layers x q/k/v, o, gate/up, down, and the
// 49,152-row LM head, the weights read from memory once), 2 cores of an AMD EPYC (Zen 5),
// against oneDNN's prepacked fp32 GEMM (what Octavo used before, and what vLLM's CPU build
// runs), `python -m octavo_bench cpu-linear`: 1 row 12.9 vs 16.9 ms, 8 rows 15.3 vs 19.6,
// 32 rows 27.6 vs 30.7, 256 rows 163 vs 167, 1,024 rows 632 vs 629. The AVX2 build against
// oneDNN held to AVX2: 14.0 vs 20.9 ms at 1 row, 20.6 vs 26.3 at 8, 46.4 vs 51.4 at 32,
// even from 256. In cache, 256 x 576 x 3,072 runs at 255 GFLOP/s on one core (its peak
// is ~262).
#include <algorithm>
#include <cstring>

#include "common.h"
#include "lanes.h"

#pragma GCC optimize("fp-contract=fast")

namespace octavo_cpu {
namespace {

#if defined(__AVX512F__)
constexpr int kBigRows = 8, kBigPanels = 3;  // 24 of 32 vector registers hold sums
#else
constexpr int kBigRows = 4, kBigPanels = 3;  // 12 of 16 (6 x 2 ran 3-6 % slower at 12-32 rows)
#endif
constexpr int64_t kDepth = 1024;  // input dimensions per pass: a group's slice stays in L2

// Rows per register block: at most kBigRows, the blocks as even as they go (AVX-512, 9 rows:
// 5 + 4 with 4 panels, not 8 + 1, whose single row's 3 sums wait on the FMA latency).
constexpr int64_t row_block(int64_t rows) {
  const int64_t blocks = (rows + kBigRows - 1) / kBigRows;
  return (rows + blocks - 1) / blocks;
}

// Panels side by side for blocks of `rows` rows: as many sums as the registers hold.
constexpr int panels_for(int64_t rows) {
  if (rows >= kBigRows) return kBigPanels;
  if (kWidth == 16) return rows <= 6 ? 4 : 3;
  return rows <= 2 ? 4 : 3;
}

struct DenseShape {
  int64_t rows, cols, depth, panels;
  const float* x;
  int64_t x_stride;
  const float* packed;
  const float* bias;  // nullptr: none
  float* out;
};

// kWidth columns from `first` of a row of `cols` (zeros past the end).
inline lanes_t load_cols(const float* row, int64_t first, int64_t cols) {
  if (first + kWidth <= cols) return load_lanes(row + first);
  alignas(64) float part[kWidth] = {};
  std::memcpy(part, row + first, (cols - first) * sizeof(float));
  return load_lanes(part);
}

inline void store_cols(float* row, int64_t first, int64_t cols, lanes_t value) {
  if (first + kWidth <= cols) return store_lanes(row + first, value);
  alignas(64) float part[kWidth];
  store_lanes(part, value);
  std::memcpy(row + first, part, (cols - first) * sizeof(float));
}

// Rows row.. (MR of them) by panels panel.. (NP), input dimensions k0..k0 + depth: the
// first slice starts from the bias (or zero), later ones from what `out` holds.
template <int MR, int NP>
void micro(const DenseShape& s, int64_t row, int64_t panel, int64_t k0, int64_t depth) {
  lanes_t acc[MR][NP];
  for (int p = 0; p < NP; ++p) {
    const int64_t col = (panel + p) * kWidth;
    const lanes_t start = s.bias != nullptr ? load_cols(s.bias, col, s.cols) : lanes_t{};
    for (int m = 0; m < MR; ++m) acc[m][p] = k0 == 0 ? start : load_cols(s.out + (row + m) * s.cols, col, s.cols);
  }
  const float* weights = s.packed + (panel * s.depth + k0) * kWidth;
  const float* x = s.x + row * s.x_stride + k0;
  for (int64_t k = 0; k < depth; ++k) {
    lanes_t w[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) w[p] = load_lanes(weights + p * s.depth * kWidth + k * kWidth);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const lanes_t a = splat_lanes(x[m * s.x_stride + k]);
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) acc[m][p] += a * w[p];
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int p = 0; p < NP; ++p) store_cols(s.out + (row + m) * s.cols, (panel + p) * kWidth, s.cols, acc[m][p]);
  }
}

using Micro = void (*)(const DenseShape&, int64_t, int64_t, int64_t, int64_t);

template <int MR>
Micro micro_for_panels(int panels) {
  switch (panels) {
    case 1: return micro<MR, 1>;
    case 2: return micro<MR, 2>;
    case 3: return micro<MR, 3>;
    default: return micro<MR, 4>;
  }
}

Micro micro_for(int64_t rows, int panels) {
  switch (rows) {
    case 1: return micro_for_panels<1>(panels);
    case 2: return micro_for_panels<2>(panels);
    case 3: return micro_for_panels<3>(panels);
    case 4: return micro_for_panels<4>(panels);
    case 5: return micro_for_panels<5>(panels);
    case 6: return micro_for_panels<6>(panels);
    case 7: return micro_for_panels<7>(panels);
    default: return micro_for_panels<8>(panels);
  }
}

// Rows first_row..end_row by `panels` panels from `panel`, slice by slice of kDepth.
void run_group(const DenseShape& s, int64_t panel, int panels, int64_t first_row, int64_t end_row) {
  const int64_t block = row_block(s.rows);
  for (int64_t k0 = 0; k0 < s.depth; k0 += kDepth) {
    const int64_t depth = std::min(kDepth, s.depth - k0);
    for (int64_t row = first_row; row < end_row; row += block) {
      const int64_t rows = std::min(block, end_row - row);
      micro_for(rows, panels)(s, row, panel, k0, depth);
    }
  }
}

void run_dense(const DenseShape& s) {
  const int64_t block = row_block(s.rows);
  const int group = panels_for(block);
  const int64_t groups = (s.panels + group - 1) / group;
  const int64_t row_blocks = (s.rows + block - 1) / block;
  const int64_t threads = at::get_num_threads();
  // Rows are split too only where the panel groups alone leave threads idle.
  const int64_t row_parts = groups >= 2 * threads ? 1 : std::min(row_blocks, (2 * threads + groups - 1) / groups);
  const int64_t blocks_per_part = (row_blocks + row_parts - 1) / row_parts;
  at::parallel_for(0, groups * row_parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / row_parts, part = task % row_parts;
      const int64_t first_row = part * blocks_per_part * block;
      const int64_t end_row = std::min(s.rows, first_row + blocks_per_part * block);
      const int panels = static_cast<int>(std::min<int64_t>(group, s.panels - g * group));
      if (first_row < end_row) run_group(s, g * group, panels, first_row, end_row);
    }
  });
}

}  // namespace

int64_t dense_panel_width() { return kWidth; }

void pack_dense_weight(at::Tensor& packed, const at::Tensor& weight) {
  const char* op = "pack_dense_weight";
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kFloat && weight.dim() == 2, op,
              ": weight must be a float32 CPU matrix [out, in]");
  const int64_t cols = weight.size(0), depth = weight.size(1), panels = (cols + kWidth - 1) / kWidth;
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(0) == panels && packed.size(1) == depth && packed.size(2) == kWidth,
              op, ": packed must be contiguous float32 [ceil(out / width), in, width] (width: dense_panel_width())");
  const at::Tensor w = weight.contiguous();
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t width = std::min<int64_t>(kWidth, cols - p * kWidth);
      float* panel = dst + p * depth * kWidth;
      if (width < kWidth) std::fill(panel, panel + depth * kWidth, 0.f);  // the last panel's padding
      for (int64_t j = 0; j < width; ++j) {
        const float* row = src + (p * kWidth + j) * depth;
        for (int64_t k = 0; k < depth; ++k) panel[k * kWidth + j] = row[k];
      }
    }
  });
}

void dense_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  const char* op = "dense_linear";
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1, op,
              ": x must be float32 [rows, in] with unit column stride");
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 3 && packed.is_contiguous(), op,
              ": packed must come from pack_dense_weight");
  TORCH_CHECK(packed.size(2) == kWidth, op, ": packed for ", packed.size(2), "-lane panels, this build uses ", kWidth,
              " (pack with the same build)");
  TORCH_CHECK(packed.size(1) == x.size(1), op, ": x has ", x.size(1), " inputs, the weight ", packed.size(1));
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(0), op,
              ": out must be contiguous float32 [rows, out]");
  const int64_t cols = out.size(1);
  TORCH_CHECK(cols > (packed.size(0) - 1) * kWidth && cols <= packed.size(0) * kWidth, op,
              ": out's columns do not match the packed weight");
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == cols, op,
                ": bias must be contiguous float32 [out]");
    bias_data = bias->data_ptr<float>();
  }
  if (x.size(0) == 0) return;
  run_dense({x.size(0), cols, x.size(1), packed.size(0), x.data_ptr<float>(), x.stride(0), packed.data_ptr<float>(),
             bias_data, out.data_ptr<float>()});
}

}  // namespace octavo_cpu
