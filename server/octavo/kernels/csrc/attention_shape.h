// What the paged attention kernels (decode_attention.cpp, prefill_attention.cpp) read of
// their inputs: the head layout, the cache's block layout and strides, the folded scales
// and the layer's options.
#pragma once

#include <cstdint>

#include "bf16_dot.h"
#include "common.h"

namespace octavo_cpu {

struct AttentionShape {
  int64_t heads, kv_heads, group, head_dim, block_size, max_blocks;
  int64_t q_token_stride, q_head_stride, slot_stride;  // slot_stride: elements per cache slot
  float scale;         // softmax scale times k_scale
  float out_scale;     // v_scale
  int64_t window;      // 0: the whole context
  float soft_cap;      // 0: no capping
  const float* sinks;  // [heads] or nullptr
  bool bf16_dot;       // bf16 queries and caches take the vdpbf16ps paths (bf16_dot.h)
};

// What a query row's weighted sums are multiplied by at the end: the output scale over its
// softmax sum (0 where it saw nothing).
inline float normaliser(const AttentionShape& s, float sum) { return sum > 0.f ? s.out_scale / sum : 0.f; }

// A context position as (block table entry, slot within the block): one division where a
// walk starts, then steps along (a division per key cost the fp32 prefill tile 9 % of its
// time on a Zen 5 core).
struct CacheCursor {
  int64_t block, within;

  CacheCursor(const AttentionShape& s, int64_t position)
      : block(position / s.block_size), within(position % s.block_size) {}

  // Elements from a head's base in the cache to this position's row.
  int64_t offset(const AttentionShape& s, const int32_t* table) const {
    return (static_cast<int64_t>(table[block]) * s.block_size + within) * s.slot_stride;
  }

  void advance(const AttentionShape& s, int64_t positions) {  // steps of at most a block or so
    for (within += positions; within >= s.block_size; within -= s.block_size) ++block;
  }
};

// query [tokens, heads, head_dim]; kv_cache [2, blocks, block_size, kv_heads, head_dim];
// block_tables [seqs, max_blocks].
inline AttentionShape attention_shape(const at::Tensor& query, const at::Tensor& kv_cache,
                                      const at::Tensor& block_tables, double scale, double k_scale, double v_scale,
                                      int64_t window, double soft_cap, const float* sinks, const char* op) {
  const int64_t heads = query.size(1), kv_heads = kv_cache.size(3);
  TORCH_CHECK(heads % kv_heads == 0, op, ": heads must be a multiple of kv_heads");
  return AttentionShape{heads,
                        kv_heads,
                        heads / kv_heads,
                        query.size(2),
                        kv_cache.size(2),
                        block_tables.size(1),
                        query.stride(0),
                        query.stride(1),
                        kv_heads * kv_cache.size(4),
                        static_cast<float>(scale * k_scale),
                        static_cast<float>(v_scale),
                        window,
                        static_cast<float>(soft_cap),
                        sinks,
                        bf16_dot_enabled()};
}

}  // namespace octavo_cpu
