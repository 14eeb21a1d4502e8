// RMSNorm, alone and fused with the residual add that precedes it in a decoder layer.
#include <cmath>

#include "common.h"

namespace octavo_cpu {
namespace {

template <typename T>
float inverse_rms(const T* row, int64_t size, float eps) {
  return 1.f / std::sqrt(sum_of_squares(row, size) / static_cast<float>(size) + eps);
}

template <typename T>
void scale_row(T* out, const T* row, const T* weight, int64_t size, float inv_rms) {
#pragma omp simd
  for (int64_t i = 0; i < size; ++i) {
    out[i] = from_float<T>(to_float(row[i]) * inv_rms * to_float(weight[i]));
  }
}

void check_rows(const at::Tensor& tensor, const at::Tensor& weight, const char* name) {
  check_cpu(tensor, name);
  TORCH_CHECK(tensor.dim() == 2 && tensor.stride(1) == 1, name, " must be [tokens, hidden] with contiguous rows");
  TORCH_CHECK(tensor.size(1) == weight.numel() && weight.is_contiguous(), name, ": weight does not match hidden size");
  TORCH_CHECK(tensor.scalar_type() == weight.scalar_type(), name, ": dtype differs from the weight's");
}

}  // namespace

// out = x / rms(x) * weight, row by row.
void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "rms_norm: x");
  check_rows(out, weight, "rms_norm: out");
  const int64_t rows = x.size(0), size = x.size(1);
  dispatch_float_bf16(x.scalar_type(), "rms_norm", [&]<typename T>() {
    const T* in = ptr<T>(x);
    const T* w = ptr<T>(weight);
    T* dst = ptr<T>(out);
    const int64_t in_stride = x.stride(0), out_stride = out.stride(0);
    at::parallel_for(0, rows, grain_for(size), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = in + r * in_stride;
        scale_row(dst + r * out_stride, row, w, size, inverse_rms(row, size, static_cast<float>(eps)));
      }
    });
  });
}

// residual = x + residual (rounded to the model dtype); x = rms_norm(residual) * weight.
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "fused_add_rms_norm: x");
  check_rows(residual, weight, "fused_add_rms_norm: residual");
  TORCH_CHECK(x.size(0) == residual.size(0), "fused_add_rms_norm: x and residual differ in tokens");
  const int64_t rows = x.size(0), size = x.size(1);
  dispatch_float_bf16(x.scalar_type(), "fused_add_rms_norm", [&]<typename T>() {
    T* xs = ptr<T>(x);
    T* res = ptr<T>(residual);
    const T* w = ptr<T>(weight);
    const int64_t x_stride = x.stride(0), res_stride = residual.stride(0);
    at::parallel_for(0, rows, grain_for(size), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T* x_row = xs + r * x_stride;
        T* res_row = res + r * res_stride;
#pragma omp simd
        for (int64_t i = 0; i < size; ++i) {
          res_row[i] = from_float<T>(to_float(x_row[i]) + to_float(res_row[i]));
        }
        scale_row(x_row, res_row, w, size, inverse_rms(res_row, size, static_cast<float>(eps)));
      }
    });
  });
}

}  // namespace octavo_cpu
