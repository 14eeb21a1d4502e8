// A lower bound on a row's k-th largest value, from its blocks' maxima: k blocks each hold a
// value at least as large as the k-th largest maximum, so the row's k-th largest is >= it.
// The sampler's top-k and the logprobs' top alternatives look only at values above it.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "common.h"

namespace octavo_cpu {

constexpr int64_t kBoundBlock = 256;  // values per block

// -inf (no bound) when the row has fewer blocks than k.
inline float kth_largest_bound(const float* x, int64_t n, int64_t k) {
  std::vector<float> maxima;
  maxima.reserve((n + kBoundBlock - 1) / kBoundBlock);
  for (int64_t start = 0; start < n; start += kBoundBlock) {
    maxima.push_back(max_of(x + start, std::min(kBoundBlock, n - start)));
  }
  if (k > static_cast<int64_t>(maxima.size())) return -std::numeric_limits<float>::infinity();
  std::nth_element(maxima.begin(), maxima.begin() + (k - 1), maxima.end(), std::greater<float>());
  return maxima[k - 1];
}

}  // namespace octavo_cpu
