// fp32 linears (out = x @ W.T + bias) on weights packed once into column panels: panel p
// holds output columns p * kWidth.. for every input dimension, [panels, in, kWidth], zeros
// past the last column. A broadcast input element against a vector of kWidth weights per
// FMA; the schedule (register blocks, L2 slices, threads, asking for the next slice) is
// dense_panels.h's. bf16 weights go to dense_linear_bf16.cpp.
//
// SmolLM2-135M's linears of one step in fp32 (30 layers x q/k/v, o, gate/up, down, and the
// 49,152-row LM head, the weights read from memory once), 2 cores of an AMD EPYC (Zen 5),
// against oneDNN's prepacked fp32 GEMM (what Octavo used before, and what vLLM's CPU build
// runs), `python -m octavo_bench cpu-linear`: 1 row 13.0 vs 15.2 ms, 4 rows 16.3 vs 19.9,
// 16 rows 17.0 vs 20.0, 32 rows 23.1 vs 32.5, 64 rows 42.5 vs 49.2, 256 rows 170 vs 167,
// 1,024 rows 673 vs 641. The AVX2 build against oneDNN held to AVX2 (before the row blocks
// asked for the next slice): 14.0 vs 20.9 ms at 1 row, 20.6 vs 26.3 at 8, 46.4 vs 51.4 at
// 32, even from 256. In cache, 256 x 576 x 3,072 runs at 255 GFLOP/s on one core (its
// peak is ~262).
#include <algorithm>
#include <cstring>

#include "amx_tiles.h"
#include "common.h"
#include "dense_panels.h"
#include "lanes.h"

#pragma GCC optimize("fp-contract=fast")

namespace octavo_cpu {
namespace {

using dense::load_cols;
using dense::store_cols;

struct DenseShape {
  // When row blocks ask for the next slice (dense_panels.h), measured on SmolLM2's step:
  // 2-8 blocks (9-64 rows on AVX-512) gain 5-30 %; a single block of 2-8 rows lost 5-10 %,
  // as did 256-512 rows (2 %).
  static constexpr int64_t kAheadOneBlock = dense::kBigRows + 1, kAheadMostBlocks = 8;
  int64_t rows, cols, depth, panels;
  const float* x;
  int64_t x_stride;
  const float* packed;
  const float* bias;  // nullptr: none
  float* out;
};

// Rows row.. (MR of them) by panels panel.. (NP), input dimensions k0..k0 + depth: the
// first slice starts from the bias (or zero), later ones from what `out` holds.
template <int MR, int NP>
struct Fp32Panels {
  static void run(const DenseShape& s, int64_t row, int64_t panel, int64_t k0, int64_t depth, dense::Ahead ahead);
};

template <int MR, int NP>
void Fp32Panels<MR, NP>::run(const DenseShape& s, int64_t row, int64_t panel, int64_t k0, int64_t depth, dense::Ahead ahead) {
  lanes_t acc[MR][NP];
  for (int p = 0; p < NP; ++p) {
    const int64_t col = (panel + p) * kWidth;
    const lanes_t start = s.bias != nullptr ? load_cols(s.bias, col, s.cols) : lanes_t{};
    for (int m = 0; m < MR; ++m) acc[m][p] = k0 == 0 ? start : load_cols(s.out + (row + m) * s.cols, col, s.cols);
  }
  const float* weights = s.packed + (panel * s.depth + k0) * kWidth;
  const float* x = s.x + row * s.x_stride + k0;
  for (int64_t k = 0; k < depth; ++k) {
    ahead.step();
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

}  // namespace

int64_t dense_panel_width() { return kWidth; }

bool dense_amx_enabled() { return amx_enabled(); }

void pack_dense_weight_bf16(at::Tensor& packed, const at::Tensor& weight);
void dense_linear_bf16(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                       const c10::optional<at::Tensor>& bias);

void pack_dense_weight(at::Tensor& packed, const at::Tensor& weight) {
  if (weight.scalar_type() == at::kBFloat16) return pack_dense_weight_bf16(packed, weight);
  const char* op = "pack_dense_weight";
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kFloat && weight.dim() == 2, op,
              ": weight must be a float32 or bfloat16 CPU matrix [out, in]");
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
  if (packed.scalar_type() == at::kBFloat16) return dense_linear_bf16(out, x, packed, bias);
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
  dense::run_panels<DenseShape, Fp32Panels>({x.size(0), cols, x.size(1), packed.size(0), x.data_ptr<float>(), x.stride(0), packed.data_ptr<float>(),
             bias_data, out.data_ptr<float>()});
}

}  // namespace octavo_cpu
