// The logprob entries of rows of log_softmax output on the CPU, packed as
// sampling/logprobs.py's `pack_logprobs` packs them (int64 [rows, 3 + 2 * widest]: the chosen
// id, its logprob's float32 bits, its rank, the `widest` best ids, their logprobs' bits), in
// one task per row instead of torch's gather, comparison, count, topk and concatenation over
// the whole [rows, vocab] tensor. The values are torch's own log_softmax, so every logprob and
// rank is bit for bit what the torch path reports:
//   rank = 1 + the number of logprobs strictly above the chosen token's;
//   the best ids: the largest logprobs, best first (ties: the lower id first), searched only
//   above kth_largest_bound.
#include <torch/library.h>

#include <vector>

#include "common.h"
#include "top_bound.h"

namespace octavo_cpu {
namespace {

int64_t count_above(const float* __restrict x, int64_t n, float value) {
  int64_t lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += x[i + j] > value ? 1 : 0;
  }
  int64_t total = 0;
  for (; i < n; ++i) total += x[i] > value ? 1 : 0;
  for (int64_t j = 0; j < kLanes; ++j) total += lanes[j];
  return total;
}

// The `widest` largest values' ids, best first, ties by the lower id.
void best_ids(const float* x, int64_t n, int64_t widest, std::vector<std::pair<float, int64_t>>& candidates) {
  const float bound = kth_largest_bound(x, n, widest);
  candidates.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] >= bound) candidates.emplace_back(x[i], i);
  }
  std::partial_sort(candidates.begin(), candidates.begin() + widest, candidates.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
}

// A float32 logprob as pack_logprobs stores it: its bits as int32, widened with the sign.
inline int64_t bits_of(float value) { return static_cast<int64_t>(std::bit_cast<int32_t>(value)); }

}  // namespace

void row_logprobs(at::Tensor& packed, const at::Tensor& logprobs, const at::Tensor& chosen, int64_t widest) {
  check_cpu(logprobs, "row_logprobs: logprobs");
  TORCH_CHECK(logprobs.scalar_type() == at::kFloat && logprobs.dim() == 2 && logprobs.stride(1) == 1,
              "row_logprobs: logprobs must be float32 [rows, vocab] with contiguous rows");
  const int64_t rows = logprobs.size(0), vocab = logprobs.size(1);
  TORCH_CHECK(widest >= 0 && widest <= vocab, "row_logprobs: widest must be in [0, vocab], got ", widest);
  TORCH_CHECK(chosen.scalar_type() == at::kLong && chosen.dim() == 1 && chosen.numel() == rows && chosen.is_contiguous(),
              "row_logprobs: chosen must be a contiguous int64 tensor of one id per row");
  TORCH_CHECK(packed.scalar_type() == at::kLong && packed.is_contiguous() && packed.dim() == 2 &&
                  packed.size(0) == rows && packed.size(1) == 3 + 2 * widest,
              "row_logprobs: packed must be a contiguous int64 [rows, 3 + 2 * widest] tensor");
  const int64_t* ids = chosen.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(ids[r] >= 0 && ids[r] < vocab, "row_logprobs: chosen id ", ids[r], " is outside the vocabulary");
  }
  const float* x = logprobs.data_ptr<float>();
  int64_t* out = packed.data_ptr<int64_t>();
  const int64_t stride = logprobs.stride(0), width = packed.size(1);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<float, int64_t>> candidates;
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * stride;
      int64_t* dst = out + r * width;
      dst[0] = ids[r];
      dst[1] = bits_of(row[ids[r]]);
      dst[2] = 1 + count_above(row, vocab, row[ids[r]]);
      if (widest == 0) continue;
      best_ids(row, vocab, widest, candidates);
      for (int64_t k = 0; k < widest; ++k) {
        dst[3 + k] = candidates[k].second;
        dst[3 + widest + k] = bits_of(candidates[k].first);
      }
    }
  });
}

}  // namespace octavo_cpu

TORCH_LIBRARY_FRAGMENT(octavo_cpu, m) {
  m.def("row_logprobs(Tensor(a!) packed, Tensor logprobs, Tensor chosen, int widest) -> ()");
}

TORCH_LIBRARY_IMPL(octavo_cpu, CPU, m) { m.impl("row_logprobs", &octavo_cpu::row_logprobs); }
