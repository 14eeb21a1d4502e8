// LoRA deltas (Punica's SGMV idea on the CPU): each row is multiplied by its own slot's A
// and B only, in one call for every slot and slice, instead of two GEMMs against every
// slot with the other slots masked out (for the few rows of a decode step those GEMMs are
// mostly fixed cost and other slots' columns). The rows of one slot go in blocks of up to
// 8 so each row of A and B^T is read once per block; the weights are fp32, or bf16 copies
// for bf16 activations, which halves what a step reads from memory.
#include <vector>

#include "common.h"
#include "vec16.h"

namespace octavo_cpu {
namespace {

struct LoRAShapes {
  int64_t slices, slots, rank, in, out;
};

// Up to kBlock rows of one slot go together: each row of A and of B^T is read once for
// all of them (reading A once per row made the kernel bound by cache bandwidth).
constexpr int64_t kBlock = 8;

// shrunk[t] = dot(x[t], a) for the N rows of a block, x as fp32 rows of width `in`.
template <int N, typename W>
void dots(const float* __restrict x, const W* __restrict a, int64_t in, float* __restrict shrunk) {
  vec16 lanes[N];
  for (int t = 0; t < N; ++t) lanes[t] = splat16(0.f);
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    const vec16 a16 = load16(a + i);
    for (int t = 0; t < N; ++t) lanes[t] += load16(x + t * in + i) * a16;
  }
  for (int t = 0; t < N; ++t) {
    float tail = 0.f;
    for (int64_t j = i; j < in; ++j) tail += x[t * in + j] * to_float(a[j]);
    shrunk[t] = tail + sum16(lanes[t]);
  }
}

// out rows[offset : offset + size] += (x A_k) B_k^T over the rank k of one slice of one
// slot; `a` is that slot's [rank, in] rows of A, `bt` its [rank, out] rows of B^T.
template <int N, typename T, typename W>
void add_slice(T* const* out_rows, const float* x, const W* a, const W* bt, const LoRAShapes& s,
               int64_t offset, int64_t size, float* __restrict acc) {
  std::fill(acc, acc + N * size, 0.f);
  float shrunk[N];
  for (int64_t k = 0; k < s.rank; ++k) {
    dots<N>(x, a + k * s.in, s.in, shrunk);
    const W* __restrict b_row = bt + k * s.out + offset;
    for (int t = 0; t < N; ++t) {
      if (shrunk[t] == 0.f) continue;  // the rows past an adapter's own rank are zero
      float* __restrict row_acc = acc + t * size;
#pragma omp simd
      for (int64_t j = 0; j < size; ++j) row_acc[j] += shrunk[t] * to_float(b_row[j]);
    }
  }
  for (int t = 0; t < N; ++t) {
    T* __restrict out_row = out_rows[t] + offset;
    const float* __restrict row_acc = acc + t * size;
#pragma omp simd
    for (int64_t j = 0; j < size; ++j) out_row[j] = from_float<T>(to_float(out_row[j]) + row_acc[j]);
  }
}

// The rows `rows[0..N)` (all of slot `slot`), every slice.
template <int N, typename T, typename W>
void add_block(T* out, int64_t out_stride, const T* x, int64_t x_stride, const int64_t* rows, int32_t slot,
               const W* flat_a, const W* block_b, const LoRAShapes& s, const std::vector<int64_t>& offsets,
               const std::vector<int64_t>& sizes, std::vector<float>& x_buf, std::vector<float>& acc) {
  T* out_rows[N];
  for (int t = 0; t < N; ++t) {
    const T* x_row = x + rows[t] * x_stride;
    for (int64_t i = 0; i < s.in; ++i) x_buf[t * s.in + i] = to_float(x_row[i]);
    out_rows[t] = out + rows[t] * out_stride;
  }
  for (int64_t slice = 0; slice < s.slices; ++slice) {
    const int64_t block = slice * s.slots + slot;  // [slice, slot] of [slices, slots, rank, *]
    add_slice<N>(out_rows, x_buf.data(), flat_a + block * s.rank * s.in, block_b + block * s.rank * s.out, s,
                 offsets[slice], sizes[slice], acc.data());
  }
}

// A task: up to kBlock rows of one slot.
struct RowBlock {
  int32_t slot;
  int64_t first, count;  // into the rows sorted by slot
};

std::vector<RowBlock> blocks_by_slot(const int32_t* slots, int64_t rows, int64_t num_slots,
                                     std::vector<int64_t>& sorted) {
  std::vector<RowBlock> blocks;
  for (int32_t slot = 0; slot < num_slots; ++slot) {
    const int64_t first = static_cast<int64_t>(sorted.size());
    for (int64_t r = 0; r < rows; ++r) {
      if (slots[r] == slot) sorted.push_back(r);
    }
    for (int64_t at = first; at < static_cast<int64_t>(sorted.size()); at += kBlock) {
      blocks.push_back({slot, at, std::min<int64_t>(kBlock, static_cast<int64_t>(sorted.size()) - at)});
    }
  }
  return blocks;
}

// Every block of rows, in parallel: the rows of one slot, 8, 4, 2 then 1 at a time.
template <typename T, typename W>
void add_blocks(at::Tensor& out, const at::Tensor& x, const W* a, const W* bt, const LoRAShapes& s,
                const std::vector<RowBlock>& blocks, const std::vector<int64_t>& sorted,
                const std::vector<int64_t>& offs, const std::vector<int64_t>& lens) {
  const T* x_data = ptr<T>(x);
  T* out_data = ptr<T>(out);
  const int64_t x_stride = x.stride(0), out_stride = out.stride(0);
  at::parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> x_buf(kBlock * s.in), acc(kBlock * s.out);
    for (int64_t b = begin; b < end; ++b) {
      const RowBlock& blk = blocks[b];
      const int64_t* rows = sorted.data() + blk.first;
      int64_t done = 0;
      auto run = [&]<int N>() {
        for (; blk.count - done >= N; done += N) {
          add_block<N>(out_data, out_stride, x_data, x_stride, rows + done, blk.slot, a, bt, s, offs, lens, x_buf,
                       acc);
        }
      };
      run.template operator()<8>();
      run.template operator()<4>();
      run.template operator()<2>();
      run.template operator()<1>();
    }
  });
}

void check_lora_args(const at::Tensor& out, const at::Tensor& x, const at::Tensor& flat_a,
                     const at::Tensor& block_b, const at::Tensor& row_slots, int64_t num_slices) {
  check_cpu(x, "lora_delta: x");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "lora_delta: x must be [rows, in] with contiguous rows");
  TORCH_CHECK(out.dim() == 2 && out.stride(1) == 1 && out.size(0) == x.size(0),
              "lora_delta: out must be [rows, out] with contiguous rows");
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "lora_delta: out and x differ in dtype");
  TORCH_CHECK(flat_a.scalar_type() == block_b.scalar_type() &&
                  (flat_a.scalar_type() == at::kFloat || flat_a.scalar_type() == at::kBFloat16),
              "lora_delta: A and B must both be float32 or both bfloat16");
  TORCH_CHECK(flat_a.is_contiguous() && block_b.is_contiguous(), "lora_delta: A and B must be contiguous");
  TORCH_CHECK(flat_a.dim() == 4 && block_b.dim() == 4 && flat_a.size(0) == num_slices &&
                  block_b.sizes().slice(0, 3) == flat_a.sizes().slice(0, 3),
              "lora_delta: A must be [slices, slots, rank, in] and B^T [slices, slots, rank, out]");
  TORCH_CHECK(flat_a.size(3) == x.size(1) && block_b.size(3) == out.size(1), "lora_delta: widths differ");
  TORCH_CHECK(row_slots.scalar_type() == at::kInt && row_slots.is_contiguous() && row_slots.numel() == x.size(0),
              "lora_delta: row_slots must be int32 [rows]");
}

}  // namespace

// out[r] += x[r] A^T B^T for the slot row_slots[r] (-1: none), slice by slice: slice i
// reaches out's columns offsets[i] .. offsets[i] + sizes[i].
void lora_delta(at::Tensor& out, const at::Tensor& x, const at::Tensor& flat_a, const at::Tensor& block_b,
                const at::Tensor& row_slots, at::IntArrayRef offsets, at::IntArrayRef sizes) {
  TORCH_CHECK(offsets.size() == sizes.size(), "lora_delta: one offset per slice size");
  check_lora_args(out, x, flat_a, block_b, row_slots, static_cast<int64_t>(sizes.size()));
  const LoRAShapes s{flat_a.size(0), flat_a.size(1), flat_a.size(2), x.size(1), out.size(1)};
  const std::vector<int64_t> offs(offsets.begin(), offsets.end()), lens(sizes.begin(), sizes.end());
  for (int64_t i = 0; i < s.slices; ++i) {
    TORCH_CHECK(offs[i] >= 0 && lens[i] >= 0 && offs[i] + lens[i] <= s.out, "lora_delta: slice ", i, " out of range");
  }
  const int32_t* slots = ptr<int32_t>(row_slots);
  for (int64_t r = 0; r < x.size(0); ++r) {
    TORCH_CHECK(slots[r] >= -1 && slots[r] < s.slots, "lora_delta: row ", r, " has slot ", slots[r]);
  }
  std::vector<int64_t> sorted;
  const std::vector<RowBlock> blocks = blocks_by_slot(slots, x.size(0), s.slots, sorted);
  dispatch_float_bf16(x.scalar_type(), "lora_delta", [&]<typename T>() {
    dispatch_float_bf16(flat_a.scalar_type(), "lora_delta", [&]<typename W>() {
      add_blocks<T, W>(out, x, ptr<W>(flat_a), ptr<W>(block_b), s, blocks, sorted, offs, lens);
    });
  });
}

}  // namespace octavo_cpu
