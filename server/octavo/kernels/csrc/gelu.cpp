// GeLU (tanh approximation)(gate) * up over the fused gate/up projection's output (Gemma's
// `gelu_pytorch_tanh`). Registered here, apart from ops.cpp, as its own library fragment.
#include <torch/library.h>

#include "common.h"

namespace octavo_cpu {
namespace {

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// 0.5 x (1 + tanh(y)) == x * sigmoid(2 y): no cancellation near tanh(y) = -1, and one exp.
inline float gelu_tanh(float x) {
  const float y = kBeta * (x + kKappa * x * x * x);
  return x / (1.f + fast_exp(-2.f * y));
}

template <typename T>
void gelu_tanh_and_mul_row(T* __restrict out, const T* __restrict gate, const T* __restrict up, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) {
    const float gelu = to_float(from_float<T>(gelu_tanh(to_float(gate[i]))));  // rounded as torch's F.gelu
    out[i] = from_float<T>(gelu * to_float(up[i]));
  }
}

// x [tokens, 2 * d] holds gate then up; out [tokens, d] = gelu_tanh(gate) * up.
void gelu_tanh_and_mul(at::Tensor& out, const at::Tensor& x) {
  check_cpu(x, "gelu_tanh_and_mul: x");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 2 == 0, "gelu_tanh_and_mul: x must be [tokens, 2 * d]");
  TORCH_CHECK(out.dim() == 2 && out.stride(1) == 1 && out.size(0) == x.size(0) && out.size(1) * 2 == x.size(1),
              "gelu_tanh_and_mul: out must be [tokens, d]");
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "gelu_tanh_and_mul: out and x differ in dtype");
  const int64_t rows = x.size(0), d = out.size(1);
  dispatch_float_bf16(x.scalar_type(), "gelu_tanh_and_mul", [&]<typename T>() {
    const T* in = ptr<T>(x);
    T* dst = ptr<T>(out);
    const int64_t in_stride = x.stride(0), out_stride = out.stride(0);
    at::parallel_for(0, rows, grain_for(2 * d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        gelu_tanh_and_mul_row(dst + r * out_stride, in + r * in_stride, in + r * in_stride + d, d);
      }
    });
  });
}

}  // namespace
}  // namespace octavo_cpu

TORCH_LIBRARY_FRAGMENT(octavo_cpu, m) { m.def("gelu_tanh_and_mul(Tensor(a!) out, Tensor x) -> ()"); }

TORCH_LIBRARY_IMPL(octavo_cpu, CPU, m) { m.impl("gelu_tanh_and_mul", &octavo_cpu::gelu_tanh_and_mul); }
