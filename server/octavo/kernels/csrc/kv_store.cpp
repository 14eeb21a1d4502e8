// Writing a step's keys and values into their paged-cache slots.
#include <cstring>
#include <type_traits>

#include "common.h"

namespace octavo_cpu {
namespace {

// One token's heads, narrowed to fp8: fp8(clamp(x * (1 / scale))), as kv_quant.quantize.
template <typename T, typename C>
void quantize_row(const T* __restrict src, C* __restrict dst, int64_t count, float inv_scale) {
  for (int64_t i = 0; i < count; ++i) dst[i] = from_float<C>(to_float(src[i]) * inv_scale);
}

template <typename T, typename C>
void store_fp8(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache, const int64_t* slots,
               double k_scale, double v_scale) {
  const int64_t tokens = key.size(0), row = kv_cache.size(3) * kv_cache.size(4);
  const int64_t num_slots = kv_cache.size(1) * kv_cache.size(2);
  C* keys = ptr<C>(kv_cache);
  C* values = keys + num_slots * row;
  const float inv_k = static_cast<float>(1.0 / k_scale), inv_v = static_cast<float>(1.0 / v_scale);
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    quantize_row(ptr<T>(key) + t * key.stride(0), keys + slots[t] * row, row, inv_k);
    quantize_row(ptr<T>(value) + t * value.stride(0), values + slots[t] * row, row, inv_v);
  }
}

void copy_rows(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache, const int64_t* slots) {
  const int64_t tokens = key.size(0), num_slots = kv_cache.size(1) * kv_cache.size(2);
  const int64_t row_bytes = kv_cache.size(3) * kv_cache.size(4) * kv_cache.element_size();
  auto* keys = static_cast<char*>(kv_cache.data_ptr());
  char* values = keys + num_slots * row_bytes;
  const auto* key_base = static_cast<const char*>(key.data_ptr());
  const auto* value_base = static_cast<const char*>(value.data_ptr());
  const int64_t key_stride = key.stride(0) * key.element_size(), value_stride = value.stride(0) * value.element_size();
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    std::memcpy(keys + slots[t] * row_bytes, key_base + t * key_stride, row_bytes);
    std::memcpy(values + slots[t] * row_bytes, value_base + t * value_stride, row_bytes);
  }
}

void check_store_inputs(const at::Tensor& key, const at::Tensor& value, const at::Tensor& kv_cache,
                        const at::Tensor& slot_mapping) {
  check_cpu(kv_cache, "store_kv: kv_cache");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.is_contiguous(), "store_kv: kv_cache must be contiguous 5-d");
  TORCH_CHECK(key.scalar_type() == value.scalar_type() &&
                  (key.scalar_type() == kv_cache.scalar_type() || is_fp8_cache(kv_cache.scalar_type())),
              "store_kv: key/value dtype differs from the cache's");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(), "store_kv: slot_mapping must be int64");
  const int64_t tokens = key.size(0), kv_heads = kv_cache.size(3), head_dim = kv_cache.size(4);
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(1) == kv_heads && key.size(2) == head_dim,
              "store_kv: key/value must be [tokens, kv_heads, head_dim]");
  TORCH_CHECK(key.stride(2) == 1 && key.stride(1) == head_dim && value.stride(2) == 1 && value.stride(1) == head_dim,
              "store_kv: each token's key/value heads must be contiguous");
  TORCH_CHECK(slot_mapping.numel() == tokens, "store_kv: one slot per token");
  const int64_t num_slots = kv_cache.size(1) * kv_cache.size(2);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slots[t] < num_slots, "store_kv: slot ", slots[t], " out of range");
}

}  // namespace

// key/value [tokens, kv_heads, head_dim] (head rows contiguous) go to
// kv_cache [2, num_blocks, block_size, kv_heads, head_dim] at slot_mapping[t]; -1 skips.
// An fp8 cache stores key / k_scale and value / v_scale (saturated, rounded to nearest even).
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache, const at::Tensor& slot_mapping,
              double k_scale, double v_scale) {
  check_store_inputs(key, value, kv_cache, slot_mapping);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  if (!is_fp8_cache(kv_cache.scalar_type())) {
    TORCH_CHECK(k_scale == 1.0 && v_scale == 1.0, "store_kv: scales other than 1 need an fp8 cache");
    return copy_rows(key, value, kv_cache, slots);
  }
  TORCH_CHECK(k_scale > 0.0 && v_scale > 0.0, "store_kv: k_scale and v_scale must be positive");
  dispatch_float_bf16(key.scalar_type(), "store_kv", [&]<typename T>() {
    dispatch_cache<T>(kv_cache.scalar_type(), [&]<typename C>() {
      if constexpr (!std::is_same_v<C, T>) store_fp8<T, C>(key, value, kv_cache, slots, k_scale, v_scale);
    });
  });
}

}  // namespace octavo_cpu
