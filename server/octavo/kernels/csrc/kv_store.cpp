// Writing a step's keys and values into their paged-cache slots.
#include <cstring>

#include "common.h"

namespace octavo_cpu {

// key/value [tokens, kv_heads, head_dim] (head rows contiguous) go to
// kv_cache [2, num_blocks, block_size, kv_heads, head_dim] at slot_mapping[t]; -1 skips.
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache, const at::Tensor& slot_mapping) {
  check_cpu(kv_cache, "store_kv: kv_cache");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.is_contiguous(), "store_kv: kv_cache must be contiguous 5-d");
  TORCH_CHECK(key.scalar_type() == kv_cache.scalar_type() && value.scalar_type() == kv_cache.scalar_type(),
              "store_kv: key/value dtype differs from the cache's");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(), "store_kv: slot_mapping must be int64");
  const int64_t tokens = key.size(0), kv_heads = kv_cache.size(3), head_dim = kv_cache.size(4);
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(1) == kv_heads && key.size(2) == head_dim,
              "store_kv: key/value must be [tokens, kv_heads, head_dim]");
  TORCH_CHECK(key.stride(2) == 1 && key.stride(1) == head_dim && value.stride(2) == 1 && value.stride(1) == head_dim,
              "store_kv: each token's key/value heads must be contiguous");
  TORCH_CHECK(slot_mapping.numel() == tokens, "store_kv: one slot per token");
  const int64_t num_slots = kv_cache.size(1) * kv_cache.size(2), row = kv_heads * head_dim;
  const int64_t row_bytes = row * kv_cache.element_size();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  auto* keys = static_cast<char*>(kv_cache.data_ptr());
  char* values = keys + num_slots * row_bytes;
  const auto* key_base = static_cast<const char*>(key.data_ptr());
  const auto* value_base = static_cast<const char*>(value.data_ptr());
  const int64_t key_stride = key.stride(0) * key.element_size(), value_stride = value.stride(0) * value.element_size();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    TORCH_CHECK(slot < num_slots, "store_kv: slot ", slot, " out of range");
    std::memcpy(keys + slot * row_bytes, key_base + t * key_stride, row_bytes);
    std::memcpy(values + slot * row_bytes, value_base + t * value_stride, row_bytes);
  }
}

}  // namespace octavo_cpu
