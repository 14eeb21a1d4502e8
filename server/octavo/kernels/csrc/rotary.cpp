// Rotary position embedding (rotate-half / NeoX layout), applied in place.
#include "common.h"

namespace octavo_cpu {

// qk [tokens, heads, head_dim] (rows of heads may be strided, head_dim contiguous) is
// rotated in place by the cos/sin tables [max_positions, head_dim] at each token's position.
void rotary_embedding(const at::Tensor& positions, at::Tensor& qk, const at::Tensor& cos, const at::Tensor& sin) {
  check_cpu(qk, "rotary_embedding: qk");
  TORCH_CHECK(qk.dim() == 3 && qk.stride(2) == 1, "rotary_embedding: qk must be [tokens, heads, head_dim]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == qk.size(0),
              "rotary_embedding: positions must be int64 [tokens]");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.size(1) == qk.size(2),
              "rotary_embedding: cos/sin must be contiguous [max_positions, head_dim]");
  TORCH_CHECK(cos.scalar_type() == qk.scalar_type(), "rotary_embedding: table dtype differs from qk's");
  const int64_t tokens = qk.size(0), heads = qk.size(1), head_dim = qk.size(2), half = head_dim / 2;
  const int64_t max_positions = cos.size(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_positions, "rotary_embedding: position ", pos[t], " out of range");
  }
  dispatch_float_bf16(qk.scalar_type(), "rotary_embedding", [&]<typename T>() {
    T* base = ptr<T>(qk);
    const T* cos_table = ptr<T>(cos);
    const T* sin_table = ptr<T>(sin);
    const int64_t token_stride = qk.stride(0), head_stride = qk.stride(1);
    at::parallel_for(0, tokens, grain_for(heads * head_dim), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const T* c = cos_table + pos[t] * head_dim;
        const T* s = sin_table + pos[t] * head_dim;
        for (int64_t h = 0; h < heads; ++h) {
          T* x = base + t * token_stride + h * head_stride;
#pragma omp simd
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
            const float ci = to_float(c[i]), si = to_float(s[i]);
            x[i] = from_float<T>(x1 * ci - x2 * si);
            x[i + half] = from_float<T>(x2 * ci + x1 * si);
          }
        }
      }
    });
  });
}

}  // namespace octavo_cpu
