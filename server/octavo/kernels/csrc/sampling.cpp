// Sampling on the CPU: each row's temperature, top-k, top-p and min-p and its draw in one task
// over that row, instead of the torch path's passes over the whole [rows, vocab] tensor (a copy,
// a division, softmaxes, a vocabulary of random numbers per row, a top-k search that grows to
// the whole vocabulary on a flat row). See sampling/native_sampler.py.
//
// Per row, with m the row's largest logit:
//  - the weights w_i = exp((x_i - m) / T), 0 for a masked (-inf) logit;
//  - top-k keeps x_i >= the k-th largest logit (ties with it too);
//  - top-p keeps w_i >= t, t the smallest weight whose strictly heavier tokens hold less than
//    p of the kept mass (a tie group is kept or dropped whole: the sort-based rule);
//  - min-p keeps w_i >= min_p * (the largest weight);
//  - the draw is the inverse CDF: the first token whose running mass exceeds u * (kept mass),
//    u in [0, 1) given per row (one number from the row's own generator). Masses add in double.
// Both thresholds are one selection: the smallest value whose strictly larger values weigh
// less than a target (top-k: each value weighs 1, target k; top-p: weight w, target p * mass),
// found by a radix select: one histogram pass over the values' ordered bits, a scan of the
// buckets, then only the bucket the boundary falls in, sorted.
#include <torch/library.h>

#include <functional>
#include <vector>

#include "common.h"
#include "lanes.h"
#include "top_bound.h"

namespace octavo_cpu {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
constexpr int kBucketShift = 19;  // 8192 buckets: sign, exponent and 4 mantissa bits
constexpr int64_t kBuckets = int64_t{1} << (32 - kBucketShift);
constexpr int64_t kBlock = 256;  // tokens whose mass the draw skips at once

// Unsigned keys that order as the floats do (negative floats' bits reversed).
inline uint32_t ordered_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

struct Scratch {
  std::vector<float> weights;                  // the row's
  std::vector<float> values, masses;           // the candidates of a selection
  std::vector<double> histogram;               // their weight by bucket (many candidates)
  std::vector<std::pair<float, float>> group;  // (value, weight), largest first: where the boundary is
  std::vector<double> block_mass;
};

struct RowSettings {
  float temperature;
  int64_t top_k;  // off unless 0 < k < vocab
  float top_p;    // off unless < 1
  float min_p;    // off unless > 0
  double uniform;
};

// The tokens whose `values` are >= `bound`, with their weights (1 each when `weights` is null),
// as the candidates of a selection; returns how many.
int64_t gather(const float* __restrict values, const float* __restrict weights, int64_t n, float bound,
               Scratch& s) {
  s.values.resize(n);
  s.masses.resize(n);
  float* __restrict kept_values = s.values.data();
  float* __restrict kept_masses = s.masses.data();
  int64_t count = 0;
  for (int64_t start = 0; start < n; start += kLanes) {  // most chunks hold no candidate
    const int64_t end = std::min(n, start + kLanes);
    if (end - start == kLanes) {
      int32_t hits = 0;
      for (int64_t j = 0; j < kLanes; ++j) hits += values[start + j] >= bound ? 1 : 0;
      if (hits == 0) continue;
    }
    for (int64_t i = start; i < end; ++i) {  // written always, kept by the count (no branch)
      kept_values[count] = values[i];
      kept_masses[count] = weights == nullptr ? 1.f : weights[i];
      count += values[i] >= bound ? 1 : 0;
    }
  }
  return count;
}

// The smallest value of s.group whose strictly larger values, with `above` (the weight of
// every larger candidate outside the group), weigh less than `target`: a quickselect by weight
// (expected linear), each round three-way partitioned around a median of three. Its largest
// value always qualifies (above < target).
float select_in_group(Scratch& s, double above, double target) {
  auto first = s.group.begin(), last = s.group.end();
  float threshold = std::max_element(first, last)->first;
  while (first != last) {
    const float a = first->first, b = (first + (last - first) / 2)->first, c = (last - 1)->first;
    const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
    const auto larger_end = std::partition(first, last, [pivot](const auto& e) { return e.first > pivot; });
    const auto equal_end = std::partition(larger_end, last, [pivot](const auto& e) { return e.first == pivot; });
    double larger = 0.0, equal = 0.0;
    for (auto it = first; it != larger_end; ++it) larger += it->second;
    if (above + larger >= target) {  // the pivot's tokens are dropped: the boundary is above it
      last = larger_end;
      continue;
    }
    for (auto it = larger_end; it != equal_end; ++it) equal += it->second;
    threshold = pivot;  // kept: look among the smaller values
    above += larger + equal;
    first = equal_end;
  }
  return threshold;
}

// The bucket of the candidates' weight histogram where the running weight, from the largest
// values down, reaches `target` (the lowest bucket when it never does); `heavier` is the weight
// of the buckets above it.
int64_t boundary_bucket(int64_t count, double target, Scratch& s, double& heavier) {
  s.histogram.assign(kBuckets, 0.0);
  for (int64_t i = 0; i < count; ++i) s.histogram[ordered_bits(s.values[i]) >> kBucketShift] += s.masses[i];
  heavier = 0.0;
  int64_t lowest = 0;
  for (int64_t b = kBuckets - 1; b >= 0; --b) {
    if (s.histogram[b] == 0.0) continue;
    if (heavier + s.histogram[b] >= target) return b;
    heavier += s.histogram[b];
    lowest = b;
  }
  heavier -= s.histogram[lowest];
  return lowest;
}

// The smallest candidate value whose strictly larger candidates weigh less than `target` in
// all (every candidate when they all do). Few candidates are sorted; many go through a
// histogram first, and only the bucket the boundary falls in is sorted.
float select_threshold(int64_t count, double target, Scratch& s) {
  constexpr int64_t kSortAtMost = 2048;
  s.group.clear();
  if (count <= kSortAtMost) {
    for (int64_t i = 0; i < count; ++i) s.group.emplace_back(s.values[i], s.masses[i]);
    return select_in_group(s, 0.0, target);
  }
  double heavier = 0.0;
  const int64_t boundary = boundary_bucket(count, target, s, heavier);
  for (int64_t i = 0; i < count; ++i) {
    if ((ordered_bits(s.values[i]) >> kBucketShift) == boundary) s.group.emplace_back(s.values[i], s.masses[i]);
  }
  return select_in_group(s, heavier, target);
}

// Top-k's logit threshold: the k-th largest, searched only above kth_largest_bound.
float top_k_threshold(const float* x, int64_t n, int64_t k, Scratch& s) {
  return select_threshold(gather(x, nullptr, n, kth_largest_bound(x, n, k), s), double(k), s);
}

// Top-p's weight threshold for the kept `mass`. Tokens lighter than (mass - p mass) / n weigh
// less than mass - p mass together, so the boundary is above them: only heavier ones are searched.
float top_p_threshold(const float* w, int64_t n, double mass, float top_p, Scratch& s) {
  const double target = double(top_p) * mass;
  const float lightest = static_cast<float>(0.99 * (mass - target) / double(n));
  const float bound = std::max(lightest, std::numeric_limits<float>::denorm_min());  // never a dropped token
  return select_threshold(gather(w, w, n, bound, s), target, s);
}

// w_i = exp((x_i - top) / T), 0 where x_i is -inf.
void weigh(const float* __restrict x, float* __restrict w, int64_t n, float top, float inverse_t) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    w[i] = x[i] == kMinusInf ? 0.f : fast_exp((x[i] - top) * inverse_t);
  }
}

// Zero the weights below `floor` and of logits below `logit_floor`; returns the kept mass and
// each block of kBlock tokens' mass (`block_mass`, for the draw).
double keep_at_least(const float* __restrict x, float* __restrict w, int64_t n, float logit_floor, float floor,
                     std::vector<double>& block_mass) {
  constexpr int64_t kDoubleLanes = 8;
  block_mass.resize((n + kBlock - 1) / kBlock);
  double mass = 0.0;
  for (int64_t start = 0, block = 0; start < n; start += kBlock, ++block) {
    const int64_t end = std::min(n, start + kBlock);
    double lanes[kDoubleLanes] = {};
    int64_t i = start;
    for (; i + kDoubleLanes <= end; i += kDoubleLanes) {
      for (int64_t j = 0; j < kDoubleLanes; ++j) {
        const float kept = (w[i + j] < floor || x[i + j] < logit_floor) ? 0.f : w[i + j];
        w[i + j] = kept;
        lanes[j] += kept;
      }
    }
    double total = 0.0;
    for (; i < end; ++i) {
      if (w[i] < floor || x[i] < logit_floor) w[i] = 0.f;
      total += w[i];
    }
    for (int64_t j = 0; j < kDoubleLanes; ++j) total += lanes[j];
    block_mass[block] = total;
    mass += total;
  }
  return mass;
}

// The first token whose running mass exceeds `target`: whole blocks are skipped by their mass,
// then one block is walked (the last kept token if rounding runs past the end).
int64_t inverse_cdf(const float* w, int64_t n, double target, const std::vector<double>& block_mass) {
  const int64_t blocks = static_cast<int64_t>(block_mass.size());
  double running = 0.0;
  int64_t block = 0;
  while (block + 1 < blocks && running + block_mass[block] <= target) running += block_mass[block++];
  for (int64_t i = block * kBlock; i < n; ++i) {
    running += w[i];
    if (w[i] > 0.f && running > target) return i;
  }
  for (int64_t i = n - 1; i > 0; --i) {
    if (w[i] > 0.f) return i;
  }
  return 0;
}

int64_t sample_row(const float* x, int64_t n, const RowSettings& row, Scratch& s) {
  const float top = max_of(x, n);
  if (top == kMinusInf) return 0;  // nothing allowed: as the torch path's argmax of NaNs
  s.weights.resize(n);
  float* w = s.weights.data();
  weigh(x, w, n, top, 1.f / row.temperature);
  float logit_floor = kMinusInf, floor = 0.f;
  if (row.top_k > 0 && row.top_k < n) logit_floor = top_k_threshold(x, n, row.top_k, s);
  double mass = keep_at_least(x, w, n, logit_floor, floor, s.block_mass);
  if (row.top_p < 1.f) {
    floor = top_p_threshold(w, n, mass, row.top_p, s);
    mass = keep_at_least(x, w, n, logit_floor, floor, s.block_mass);
  }
  if (row.min_p > 0.f) {
    floor = std::max(floor, row.min_p * max_of(w, n));
    mass = keep_at_least(x, w, n, logit_floor, floor, s.block_mass);
  }
  return inverse_cdf(w, n, row.uniform * mass, s.block_mass);
}

// A float32 [rows, n] CPU tensor with contiguous, non-empty rows, or a clear error.
void check_float_rows(const at::Tensor& values, const char* name) {
  check_cpu(values, name);
  TORCH_CHECK(values.scalar_type() == at::kFloat && values.dim() == 2 && values.stride(1) == 1, name,
              " must be float32 [rows, n] with contiguous rows");
  TORCH_CHECK(values.size(1) > 0, name, ": the rows are empty");
}

template <typename T>
T* checked(const at::Tensor& tensor, at::ScalarType dtype, int64_t rows, const char* name) {
  TORCH_CHECK(tensor.scalar_type() == dtype && tensor.dim() == 1 && tensor.numel() == rows && tensor.is_contiguous(),
              name, " must be a contiguous ", dtype, " tensor of one value per row");
  return tensor.data_ptr<T>();
}

constexpr int64_t kFindBlock = 64;  // values compared at once while looking for the largest

// The largest of `x[0, n)` (NaNs passed over), and whether a NaN is among them: vector
// maxima in two chains (GCC leaves a loop of std::max over lanes scalar: 2.7x slower).
float largest(const float* __restrict x, int64_t n, bool& nan) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  lanes_t best0 = splat_lanes(minus_inf), best1 = best0;
  ilanes_t unordered = {};
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    const lanes_t a = load_lanes(x + i), b = load_lanes(x + i + kWidth);
    best0 = a > best0 ? a : best0;
    best1 = b > best1 ? b : best1;
    unordered |= (a != a) | (b != b);
  }
  best0 = best1 > best0 ? best1 : best0;
  float best = minus_inf;
  nan = false;
  for (int64_t j = 0; j < kWidth; ++j) {
    best = std::max(best, best0[j]);
    nan |= unordered[j] != 0;
  }
  for (; i < n; ++i) {
    best = std::max(best, x[i]);
    nan |= x[i] != x[i];
  }
  return best;
}

// Whether the kFindBlock values at `x` hold `target` (with `nan`: a NaN); no early exit.
inline bool block_holds(const float* __restrict x, float target, bool nan) {
  const lanes_t wanted = splat_lanes(target);
  ilanes_t hit = {};
  for (int64_t j = 0; j < kFindBlock; j += kWidth) {
    const lanes_t v = load_lanes(x + j);
    hit |= nan ? (v != v) : (v == wanted);
  }
  for (int64_t j = 0; j < kWidth; ++j) {
    if (hit[j] != 0) return true;
  }
  return false;
}

// The first index of `x[0, n)` holding `target` (with `nan`: the first NaN).
int64_t first_index_of(const float* __restrict x, int64_t n, float target, bool nan) {
  int64_t start = 0;
  while (start + kFindBlock <= n && !block_holds(x + start, target, nan)) start += kFindBlock;
  for (int64_t j = start; j < n; ++j) {
    if (nan ? x[j] != x[j] : x[j] == target) return j;
  }
  return 0;  // not reached: `target` is one of the values
}

// torch.argmax of a row: the first index of its largest value, or of its first NaN (a NaN
// counts as the largest); 0 for a row of -inf only.
int64_t argmax_row(const float* __restrict x, int64_t n) {
  bool nan = false;
  const float best = largest(x, n, nan);
  return first_index_of(x, n, best, nan);
}

}  // namespace

// out [rows] int64: each row's argmax (the first on ties) of float32 values [rows, n]. torch's
// max(dim=-1) keeps an index beside each lane's maximum and ran 10x slower than a sum over
// the same tensor (256 rows of 49,152 logits, 2 AVX2 cores: 13.9 ms); this is a vector max,
// then a vector search for the first block holding it (64 rows, one AVX2 core: 0.49 ms, a
// sum over them 0.28 ms).
void argmax_rows(at::Tensor& out, const at::Tensor& values) {
  check_float_rows(values, "argmax_rows: values");
  const int64_t rows = values.size(0), n = values.size(1);
  int64_t* indices = checked<int64_t>(out, at::kLong, rows, "argmax_rows: out");
  const float* x = values.data_ptr<float>();
  const int64_t stride = values.stride(0);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) indices[r] = argmax_row(x + r * stride, n);
  });
}

// out [rows] int64: one token per row of float32 logits [rows, vocab]; one setting per row.
void sample_rows(at::Tensor& out, const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                 const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& uniform) {
  check_float_rows(logits, "sample_rows: logits");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  int64_t* tokens = checked<int64_t>(out, at::kLong, rows, "sample_rows: out");
  const float* temperatures = checked<float>(temperature, at::kFloat, rows, "sample_rows: temperature");
  const int64_t* ks = checked<int64_t>(top_k, at::kLong, rows, "sample_rows: top_k");
  const float* ps = checked<float>(top_p, at::kFloat, rows, "sample_rows: top_p");
  const float* min_ps = checked<float>(min_p, at::kFloat, rows, "sample_rows: min_p");
  const double* us = checked<double>(uniform, at::kDouble, rows, "sample_rows: uniform");
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(temperatures[r] > 0.f, "sample_rows: temperature must be > 0, got ", temperatures[r]);
    TORCH_CHECK(us[r] >= 0.0 && us[r] < 1.0, "sample_rows: uniform must be in [0, 1), got ", us[r]);
  }
  const float* x = logits.data_ptr<float>();
  const int64_t stride = logits.stride(0);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t r = begin; r < end; ++r) {
      const RowSettings row{temperatures[r], ks[r], ps[r], min_ps[r], us[r]};
      tokens[r] = sample_row(x + r * stride, vocab, row, scratch);
    }
  });
}

}  // namespace octavo_cpu

TORCH_LIBRARY_FRAGMENT(octavo_cpu, m) {
  m.def("sample_rows(Tensor(a!) out, Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, "
        "Tensor uniform) -> ()");
  m.def("argmax_rows(Tensor(a!) out, Tensor values) -> ()");
}

TORCH_LIBRARY_IMPL(octavo_cpu, CPU, m) {
  m.impl("sample_rows", &octavo_cpu::sample_rows);
  m.impl("argmax_rows", &octavo_cpu::argmax_rows);
}
