// Shared helpers of Octavo's CPU kernels: element access in fp32, dtype dispatch, threading.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace octavo_cpu {

// Kernels see bfloat16 as its raw bits (uint16_t): GCC vectorizes integer shifts, not
// loads of c10::BFloat16 structs.
using bf16_bits = uint16_t;

inline float to_float(float value) { return value; }
inline float to_float(bf16_bits value) { return std::bit_cast<float>(static_cast<uint32_t>(value) << 16); }

template <typename T>
inline T from_float(float value);

template <>
inline float from_float<float>(float value) {
  return value;
}

// Round to nearest even, as torch does; NaN stays a (quiet) NaN.
template <>
inline bf16_bits from_float<bf16_bits>(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return value != value ? bf16_bits{0x7FC0} : static_cast<bf16_bits>(rounded);
}

// An fp8 KV cache's elements as their raw bits (see attention/kv_quant.py).
struct fp8_e4m3 {
  uint8_t bits;
};
struct fp8_e5m2 {
  uint8_t bits;
};

// Exact widening without fp32 subnormals (so DAZ cannot change it): a normal fp8 number
// gets its exponent rebiased, a subnormal one is its mantissa times the smallest step.
// The formats' inf/NaN patterns are never stored (stores saturate) and are not special here.
template <int MantissaBits, int Bias>
inline float fp8_to_float(uint8_t bits) {
  constexpr float kStep = 1.f / static_cast<float>(1u << (Bias + MantissaBits - 1));  // smallest subnormal
  const uint32_t magnitude = bits & 0x7Fu;
  const float subnormal = static_cast<float>(magnitude) * kStep;
  const uint32_t normal = (magnitude << (23 - MantissaBits)) + (static_cast<uint32_t>(127 - Bias) << 23);
  const uint32_t value = magnitude < (1u << MantissaBits) ? std::bit_cast<uint32_t>(subnormal) : normal;
  return std::bit_cast<float>(value | (static_cast<uint32_t>(bits & 0x80u) << 24));
}

inline float to_float(fp8_e4m3 value) { return fp8_to_float<3, 7>(value.bits); }
inline float to_float(fp8_e5m2 value) { return fp8_to_float<2, 15>(value.bits); }

// Saturating, round-to-nearest-even narrowing: torch's own conversion after a clamp to the
// largest finite value, so a store equals `kv_quant.quantize` bit for bit.
template <>
inline fp8_e4m3 from_float<fp8_e4m3>(float value) {
  const float limit = 448.f;
  return fp8_e4m3{c10::detail::fp8e4m3fn_from_fp32_value(std::min(std::max(value, -limit), limit))};
}

template <>
inline fp8_e5m2 from_float<fp8_e5m2>(float value) {
  const float limit = 57344.f;
  return fp8_e5m2{c10::detail::fp8e5m2_from_fp32_value(std::min(std::max(value, -limit), limit))};
}

inline bool is_fp8_cache(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2;
}

template <typename T>
inline T* ptr(const at::Tensor& tensor) {
  return static_cast<T*>(tensor.data_ptr());
}

// Cephes' expf polynomial, highest degree first: e^r = 1 + r + r^2 p(r) for |r| <= ln(2)/2.
constexpr float kExpPolynomial[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// e^r for |r| <= ln(2)/2; V is float or a GCC float vector.
template <typename V>
inline V exp_polynomial(V r) {
  V p = V{} + kExpPolynomial[0];
  for (int i = 1; i < 6; ++i) p = p * r + kExpPolynomial[i];
  return p * r * r + r + 1.f;
}

// exp(x) that the compiler can vectorize (Cephes' range reduction and polynomial, ~1 ulp):
// glibc's expf is a call per element unless built with -ffast-math.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.7f);
  const float t = x * 1.44269504088896341f + 0.5f;
#if defined(__x86_64__) && !defined(__SSE4_1__)
  // A plain x86-64 build has no vector floor (SSE4.1's roundps): std::floor would be a call per
  // element. Round to nearest by adding and removing 1.5 * 2^23 (|t| < 130), then step down.
  const float nearest = (t + 12582912.f) - 12582912.f;
  const float n = nearest > t ? nearest - 1.f : nearest;
#else
  const float n = std::floor(t);
#endif
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  return exp_polynomial(r) * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// Reductions keep 16 partial results in a fixed array that the compiler turns into vector
// registers (`#pragma omp simd reduction` makes GCC spill per-lane arrays to memory), then
// add them pairwise: a tree of 4 vector steps instead of 16 dependent scalar additions.
constexpr int64_t kLanes = 16;

inline float add_lanes(float* __restrict lanes) {
  for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (int64_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

template <typename T>
inline float dot(const float* __restrict a, const T* __restrict b, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += a[i + j] * to_float(b[i + j]);
  }
  float total = 0.f;
  for (; i < n; ++i) total += a[i] * to_float(b[i]);
  return total + add_lanes(lanes);
}

template <typename T>
inline float sum_of_squares(const T* __restrict x, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += to_float(x[i + j]) * to_float(x[i + j]);
  }
  float total = 0.f;
  for (; i < n; ++i) total += to_float(x[i]) * to_float(x[i]);
  return total + add_lanes(lanes);
}

inline float sum(const float* __restrict x, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += x[i + j];
  }
  float total = 0.f;
  for (; i < n; ++i) total += x[i];
  return total + add_lanes(lanes);
}

inline float max_of(const float* __restrict x, int64_t n) {
  float lanes[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lanes[j] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = std::max(lanes[j], x[i + j]);
  }
  float best = -std::numeric_limits<float>::infinity();
  for (; i < n; ++i) best = std::max(best, x[i]);
  for (int64_t j = 0; j < kLanes; ++j) best = std::max(best, lanes[j]);
  return best;
}

// Runs `body.template operator()<T>()` with T = float or bf16_bits by the tensor dtype.
template <typename Body>
void dispatch_float_bf16(at::ScalarType dtype, const char* op, Body&& body) {
  if (dtype == at::kFloat) {
    body.template operator()<float>();
  } else if (dtype == at::kBFloat16) {
    body.template operator()<bf16_bits>();
  } else {
    TORCH_CHECK(false, op, ": only float32 and bfloat16 are supported, got ", dtype);
  }
}

// Runs `body.template operator()<C>()` with C = T (a cache of the query's type) or an fp8
// element type, by the cache's dtype.
template <typename T, typename Body>
void dispatch_cache(at::ScalarType dtype, Body&& body) {
  if (dtype == at::kFloat8_e4m3fn) {
    body.template operator()<fp8_e4m3>();
  } else if (dtype == at::kFloat8_e5m2) {
    body.template operator()<fp8_e5m2>();
  } else {
    body.template operator()<T>();
  }
}

// Rows per task so that one thread gets at least ~16k elements (thread wake-ups cost µs).
inline int64_t grain_for(int64_t row_elements) {
  constexpr int64_t kMinElementsPerTask = 16384;
  return std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, row_elements));
}

inline void check_cpu(const at::Tensor& tensor, const char* name) {
  TORCH_CHECK(tensor.device().is_cpu(), name, " must be a CPU tensor");
}

// The attention kernels' per-layer options, checked; returns the sinks' data (nullptr:
// none). Window 0 and soft-cap 0 mean none; sinks are float32 [heads].
inline const float* check_attention_options(const at::Tensor& query, int64_t window, double soft_cap,
                                            const c10::optional<at::Tensor>& sinks, const char* op) {
  TORCH_CHECK(window >= 0, op, ": window must be >= 0 (0: no window)");
  TORCH_CHECK(soft_cap >= 0.0 && std::isfinite(soft_cap), op, ": soft_cap must be >= 0 (0: none)");
  if (!sinks.has_value()) return nullptr;
  const at::Tensor& t = *sinks;
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 1 &&
                  t.size(0) == query.size(1),
              op, ": sinks must be a contiguous float32 CPU tensor [heads]");
  return t.data_ptr<float>();
}

}  // namespace octavo_cpu
