// SiLU(gate) * up over the fused gate/up projection's output.
#include "common.h"

namespace octavo_cpu {
namespace {

template <typename T>
void silu_and_mul_row(T* __restrict out, const T* __restrict gate, const T* __restrict up, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) {
    const float g = to_float(gate[i]);
    const float silu = to_float(from_float<T>(g / (1.f + fast_exp(-g))));  // rounded as torch's F.silu
    out[i] = from_float<T>(silu * to_float(up[i]));
  }
}

}  // namespace

// x [tokens, 2 * d] holds gate then up; out [tokens, d] = silu(gate) * up.
void silu_and_mul(at::Tensor& out, const at::Tensor& x) {
  check_cpu(x, "silu_and_mul: x");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 2 == 0, "silu_and_mul: x must be [tokens, 2 * d]");
  TORCH_CHECK(out.dim() == 2 && out.stride(1) == 1 && out.size(0) == x.size(0) && out.size(1) * 2 == x.size(1),
              "silu_and_mul: out must be [tokens, d]");
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "silu_and_mul: out and x differ in dtype");
  const int64_t rows = x.size(0), d = out.size(1);
  dispatch_float_bf16(x.scalar_type(), "silu_and_mul", [&]<typename T>() {
    const T* in = ptr<T>(x);
    T* dst = ptr<T>(out);
    const int64_t in_stride = x.stride(0), out_stride = out.stride(0);
    at::parallel_for(0, rows, grain_for(2 * d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        silu_and_mul_row(dst + r * out_stride, in + r * in_stride, in + r * in_stride + d, d);
      }
    });
  });
}

}  // namespace octavo_cpu
