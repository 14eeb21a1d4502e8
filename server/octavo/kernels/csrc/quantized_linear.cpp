// Linears on weights kept in quantized blocks (GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 of 32
// columns and its K-quants Q4_K, Q5_K, Q6_K of 256; GPTQ/AWQ groups converted to Q4 blocks
// with fp32 scales; int8 rows with one scale per row). Every kind is read as 32-column
// (sub-)blocks of small integers q with w = d * q + m (gguf_blocks.h decodes GGUF's).
//
// `quantized_linear` is llama.cpp's CPU scheme: each activation row is quantized to int8
// per block of 32 (scale d_x, and d_x * sum(q_x) for the weights' offsets), then every
// weight block is multiplied with it in integers (maddubs + madd: u8 x s8 pairs into int32
// lanes), scaled by d_w * d_x into 8 float lanes, summed once per output. A weight row is
// read once per call and reused for every activation row. Best for a few rows (decode);
// for many rows `dequantize_blocks` expands the weights for a float GEMM instead.
#include <array>
#include <cstring>
#include <vector>

#include "common.h"
#include "gguf_blocks.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace octavo_cpu {

namespace {

constexpr int64_t kBlock = 32;

// Kind ids: GGML's type numbers for the GGUF kinds, Octavo's own above 100.
enum Kind : int64_t {
  Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14,
  Q4_F32 = 100, INT8_ROWS = 101, FP8_ROWS = 102
};

constexpr bool is_super(int64_t kind) { return kind == Q4_K || kind == Q5_K || kind == Q6_K; }

// Columns per block: 256 for the K-quants (eight 32-column sub-blocks), else 32.
constexpr int64_t block_columns(int64_t kind) { return is_super(kind) ? 256 : kBlock; }

constexpr int64_t block_bytes(int64_t kind) {
  switch (kind) {
    case Q4_0: return 18;   // fp16 d, 16 bytes of nibbles: w = d * (q - 8)
    case Q4_1: return 20;   // fp16 d, fp16 m, 16 bytes of nibbles: w = d * q + m
    case Q5_0: return 22;   // fp16 d, 32 fifth bits, 16 bytes of nibbles: w = d * (q - 16)
    case Q5_1: return 24;   // fp16 d, fp16 m, 32 fifth bits, 16 bytes of nibbles: w = d * q + m
    case Q8_0: return 34;   // fp16 d, 32 int8: w = d * q
    case Q4_K: return 144;  // 256 columns; gguf_blocks.h
    case Q5_K: return 176;
    case Q6_K: return 210;
    case Q4_F32: return 24; // fp32 d, fp32 m, 16 bytes of nibbles: w = d * q + m
    case INT8_ROWS: return 32;  // 32 int8; the row's scale is separate
    case FP8_ROWS: return 32;   // 32 fp8 e4m3fn; the row's scale is separate (dequantize only)
    default: return 0;
  }
}

void check_kind(int64_t kind) {
  TORCH_CHECK(block_bytes(kind) > 0, "quantized blocks: unsupported block kind ", kind);
}

using gguf_blocks::fp16;

// Every e4m3fn byte's value (sign, 4-bit exponent biased by 7, 3-bit mantissa; exponent 0
// is subnormal; S.1111.111 is NaN).
inline float fp8_e4m3_value(uint8_t byte) {
  static const auto table = [] {
    std::array<float, 256> values{};
    for (int b = 0; b < 256; ++b) {
      const int exponent = (b >> 3) & 0xF, mantissa = b & 7;
      float value = exponent == 0 ? std::ldexp(mantissa / 8.f, -6)
                                  : std::ldexp(1.f + mantissa / 8.f, exponent - 7);
      if (exponent == 15 && mantissa == 7) value = std::numeric_limits<float>::quiet_NaN();
      values[b] = (b & 0x80) ? -value : value;
    }
    return values;
  }();
  return table[byte];
}

inline float read_f32(const uint8_t* src) {
  float value;
  std::memcpy(&value, src, 4);
  return value;
}

// A 32-column block's scale d, offset m (w = d * q + m, q unsigned for the 4- and 5-bit
// kinds), payload and (Q5_0, Q5_1) fifth bits.
struct BlockView {
  float d, m;
  const uint8_t* q;
  uint32_t fifth = 0;
};

template <int64_t kind>
inline BlockView view_block(const uint8_t* block) {
  switch (kind) {
    case Q4_0: {
      const float d = fp16(block);
      return {d, -8.f * d, block + 2};
    }
    case Q4_1: return {fp16(block), fp16(block + 2), block + 4};
    case Q5_0: {
      const float d = fp16(block);
      return {d, -16.f * d, block + 6, gguf_blocks::fifth_bits(block + 2)};
    }
    case Q5_1: return {fp16(block), fp16(block + 2), block + 8, gguf_blocks::fifth_bits(block + 4)};
    case Q8_0: return {fp16(block), 0.f, block + 2};
    case Q4_F32: return {read_f32(block), read_f32(block + 4), block + 8};
    default: return {1.f, 0.f, block};  // INT8_ROWS
  }
}

constexpr bool is_4bit(int64_t kind) { return kind == Q4_0 || kind == Q4_1 || kind == Q4_F32; }
constexpr bool is_5bit(int64_t kind) { return kind == Q5_0 || kind == Q5_1; }
constexpr bool is_unsigned(int64_t kind) {
  return is_4bit(kind) || is_5bit(kind) || kind == Q4_K || kind == Q5_K;
}

// The 32 integers of a block in column order (4-bit: byte j holds column j low, j + 16 high;
// 5-bit: plus bit j of the fifth bits at 16).
template <int64_t kind>
inline void unpack_block(const BlockView& block, int32_t* out) {
  if constexpr (is_4bit(kind) || is_5bit(kind)) {
    for (int64_t j = 0; j < 16; ++j) {
      out[j] = block.q[j] & 0x0F;
      out[j + 16] = block.q[j] >> 4;
    }
    if constexpr (is_5bit(kind)) {
      for (int64_t j = 0; j < kBlock; ++j) out[j] |= ((block.fifth >> j) & 1) << 4;
    }
  } else {
    for (int64_t j = 0; j < kBlock; ++j) out[j] = static_cast<int8_t>(block.q[j]);
  }
}

// Activations quantized per block of 32: int8 values, scale, scale * sum of the values.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, scaled_sum;
};

template <typename T>
void quantize_row(const T* x, int64_t k, int8_t* q, float* d, float* scaled_sum) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const T* src = x + b * kBlock;
    float amax = 0.f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(to_float(src[j])));
    const float scale = amax / 127.f, inverse = amax > 0.f ? 127.f / amax : 0.f;
    int32_t total = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
      const int32_t value = static_cast<int32_t>(std::nearbyint(to_float(src[j]) * inverse));
      q[b * kBlock + j] = static_cast<int8_t>(value);
      total += value;
    }
    d[b] = scale;
    scaled_sum[b] = scale * static_cast<float>(total);
  }
}

template <typename T>
QuantizedRows quantize_rows(const at::Tensor& x) {
  const int64_t rows = x.size(0), k = x.size(1), blocks = k / kBlock;
  QuantizedRows out{std::vector<int8_t>(rows * k), std::vector<float>(rows * blocks),
                    std::vector<float>(rows * blocks)};
  const T* data = ptr<T>(x);
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(data + r * k, k, out.q.data() + r * k, out.d.data() + r * blocks,
                   out.scaled_sum.data() + r * blocks);
    }
  });
  return out;
}

#if defined(__AVX2__)
template <int64_t kind>
inline __m256i block_integers(const BlockView& block) {
  if constexpr (is_4bit(kind)) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.q));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
  }
  if constexpr (is_5bit(kind)) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.q));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_or_si256(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)),
                           gguf_blocks::fifth_bit_bytes(block.fifth));
  }
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.q));
}

// 8 int32 lanes of sum(w * x) over the block (lanes 0-3: columns 0-15); w unsigned (4-,
// 5-bit) or signed (8-bit, Q6_K).
template <int64_t kind>
inline __m256i block_products(__m256i w, __m256i x) {
  if constexpr (!is_unsigned(kind)) {  // make w unsigned, moving its sign onto x
    x = _mm256_sign_epi8(x, w);
    w = _mm256_sign_epi8(w, w);
  }
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

inline float horizontal_sum(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
}
#endif

// sum_k w[k] * x[k] for one weight row and one quantized activation row.
template <int64_t kind>
float row_dot(const uint8_t* row, int64_t blocks, const int8_t* xq, const float* xd,
              const float* x_scaled_sum) {
  constexpr int64_t bytes = block_bytes(kind);
  float offsets = 0.f;
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const BlockView block = view_block<kind>(row + b * bytes);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock));
    const __m256i products = block_products<kind>(block_integers<kind>(block), x);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), _mm256_set1_ps(block.d * xd[b]), acc);
    offsets += block.m * x_scaled_sum[b];
  }
  return horizontal_sum(acc) + offsets;
#else
  float total = 0.f;
  int32_t w[kBlock];
  for (int64_t b = 0; b < blocks; ++b) {
    const BlockView block = view_block<kind>(row + b * bytes);
    unpack_block<kind>(block, w);
    int32_t products = 0;
    for (int64_t j = 0; j < kBlock; ++j) products += w[j] * xq[b * kBlock + j];
    total += static_cast<float>(products) * block.d * xd[b];
    offsets += block.m * x_scaled_sum[b];
  }
  return total + offsets;
#endif
}

// The 32 integers of a K-quant super-block's sub-block j.
template <int64_t kind>
inline void unpack_sub_block(const uint8_t* block, int64_t j, int32_t* out) {
  if constexpr (kind == Q4_K) gguf_blocks::q4k_values(block, j, out);
  else if constexpr (kind == Q5_K) gguf_blocks::q5k_values(block, j, out);
  else gguf_blocks::q6k_values(block, j, out);
}

#if defined(__AVX2__)
template <int64_t kind>
inline __m256i sub_block_integers(const uint8_t* block, int64_t j) {
  if constexpr (kind == Q4_K) return gguf_blocks::q4k_integers(block, j);
  else if constexpr (kind == Q5_K) return gguf_blocks::q5k_integers(block, j);
  else return gguf_blocks::q6k_integers(block, j);
}
#endif

// row_dot over K-quant super-blocks; `blocks` counts 32-column sub-blocks, as the
// activations' blocks do. Scales are decoded once per super-block; Q6_K's two per
// sub-block scale the int32 lanes of columns 0-15 and 16-31 apart.
template <int64_t kind>
float super_row_dot(const uint8_t* row, int64_t blocks, const int8_t* xq, const float* xd,
                    const float* x_scaled_sum) {
  constexpr int64_t bytes = block_bytes(kind), subs = gguf_blocks::kSubBlocks;
  gguf_blocks::SuperScales scales;
  float offsets = 0.f;
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
#else
  float total = 0.f;
  int32_t w[kBlock];
#endif
  for (int64_t s = 0; s < blocks / subs; ++s) {
    const uint8_t* block = row + s * bytes;
    gguf_blocks::decode_scales<kind == Q6_K>(block, scales);
    for (int64_t j = 0; j < subs; ++j) {
      const int64_t at = s * subs + j;
      const float low = scales.d[2 * j] * xd[at], high = scales.d[2 * j + 1] * xd[at];
#if defined(__AVX2__)
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + at * kBlock));
      const __m256i products = block_products<kind>(sub_block_integers<kind>(block, j), x);
      const __m256 scale = _mm256_set_m128(_mm_set1_ps(high), _mm_set1_ps(low));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), scale, acc);
#else
      unpack_sub_block<kind>(block, j, w);
      int32_t first = 0, second = 0;
      for (int64_t l = 0; l < 16; ++l) first += w[l] * xq[at * kBlock + l];
      for (int64_t l = 16; l < kBlock; ++l) second += w[l] * xq[at * kBlock + l];
      total += static_cast<float>(first) * low + static_cast<float>(second) * high;
#endif
      if constexpr (kind != Q6_K) offsets += scales.m[j] * x_scaled_sum[at];
    }
  }
#if defined(__AVX2__)
  return horizontal_sum(acc) + offsets;
#else
  return total + offsets;
#endif
}

#if defined(__AVX512F__)
// Two blocks per step in 512-bit registers with AVX512-VNNI's dpbusd (u8 x s8 summed in
// groups of 4 straight into int32): about half the instructions of the AVX2 loop. Built
// for AVX512-VNNI only (target attribute) and chosen at run time.
template <int64_t kind>
__attribute__((target("avx512vnni,avx512bw,avx512vl,avx512dq,avx512f"))) float row_dot_vnni(
    const uint8_t* row, int64_t blocks, const int8_t* xq, const float* xd, const float* x_scaled_sum) {
  constexpr int64_t bytes = block_bytes(kind);
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc = _mm512_setzero_ps();
  float offsets = 0.f;
  int64_t b = 0;
  for (; b + 1 < blocks; b += 2) {
    const BlockView first = view_block<kind>(row + b * bytes);
    const BlockView second = view_block<kind>(row + (b + 1) * bytes);
    __m512i x = _mm512_loadu_si512(xq + b * kBlock);
    __m512i w;
    if constexpr (is_4bit(kind)) {  // lanes: first's low nibbles, its high, second's low, high
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first.q));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(second.q));
      const __m512i raw = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a, a)),
                                             _mm256_set_m128i(c, c), 1);
      w = _mm512_mask_blend_epi64(0xCC, raw, _mm512_srli_epi16(raw, 4));
      w = _mm512_and_si512(w, _mm512_set1_epi8(0x0F));
    } else {  // signed weights: |w| unsigned, w's sign moved onto x
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first.q));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second.q));
      w = _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
      x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), zero, x);
      w = _mm512_abs_epi8(w);
    }
    const __m512i products = _mm512_dpbusd_epi32(zero, w, x);
    const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(first.d * xd[b]),
                                            _mm256_set1_ps(second.d * xd[b + 1]), 1);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(products), scale, acc);
    offsets += first.m * x_scaled_sum[b] + second.m * x_scaled_sum[b + 1];
  }
  float total = _mm512_reduce_add_ps(acc) + offsets;
  if (b < blocks) {  // an odd block count: the last one on the AVX2 path
    total += row_dot<kind>(row + b * bytes, 1, xq + b * kBlock, xd + b, x_scaled_sum + b);
  }
  return total;
}

inline bool cpu_has_vnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has;
}
#endif

template <int64_t kind>
inline float fast_row_dot(const uint8_t* row, int64_t blocks, const int8_t* xq, const float* xd,
                          const float* x_scaled_sum) {
  if constexpr (is_super(kind)) {
    return super_row_dot<kind>(row, blocks, xq, xd, x_scaled_sum);
  } else {
#if defined(__AVX512F__)
    if constexpr (!is_5bit(kind)) {  // the VNNI loop reads 4- and 8-bit blocks only
      if (cpu_has_vnni()) return row_dot_vnni<kind>(row, blocks, xq, xd, x_scaled_sum);
    }
#endif
    return row_dot<kind>(row, blocks, xq, xd, x_scaled_sum);
  }
}

void check_blocks(const at::Tensor& blocks, int64_t kind, int64_t k) {
  check_kind(kind);
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
              "quantized blocks must be a contiguous uint8 [rows, bytes] tensor");
  TORCH_CHECK(k % block_columns(kind) == 0, "quantized blocks: ", k,
              " input features is not a multiple of ", block_columns(kind));
  TORCH_CHECK(blocks.size(1) == k / block_columns(kind) * block_bytes(kind), "quantized blocks: ",
              blocks.size(1),
              " bytes per row do not hold ", k, " features of kind ", kind);
}

// Rows are short (a few hundred bytes); asking for the next rows early keeps the loads
// from waiting on memory (about 3x faster on weights that are not in cache).
constexpr int64_t kPrefetchRows = 4;

inline void prefetch_row(const uint8_t* row, int64_t bytes) {
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset);
}

template <int64_t kind>
void linear_rows(at::Tensor& out, const QuantizedRows& xq, const at::Tensor& blocks,
                 const float* scales, int64_t k) {
  const int64_t rows = out.size(0), n = out.size(1), per_row = k / kBlock;
  const uint8_t* weights = blocks.data_ptr<uint8_t>();
  const int64_t row_bytes = blocks.size(1);
  bf16_bits* out_bf16 = out.scalar_type() == at::kBFloat16 ? ptr<bf16_bits>(out) : nullptr;
  float* out_float = out_bf16 ? nullptr : ptr<float>(out);
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const float scale = scales ? scales[j] : 1.f;
      if (j + kPrefetchRows < end) prefetch_row(weights + (j + kPrefetchRows) * row_bytes, row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        const float value = scale * fast_row_dot<kind>(weights + j * row_bytes, per_row, xq.q.data() + r * k,
                                                  xq.d.data() + r * per_row, xq.scaled_sum.data() + r * per_row);
        if (out_bf16) out_bf16[r * n + j] = from_float<bf16_bits>(value);
        else out_float[r * n + j] = value;
      }
    }
  });
}

inline void store_block(bf16_bits* out_bf16, float* out_float, int64_t at, const float* values) {
  if (out_bf16) {
    for (int64_t i = 0; i < kBlock; ++i) out_bf16[at + i] = from_float<bf16_bits>(values[i]);
  } else {
    for (int64_t i = 0; i < kBlock; ++i) out_float[at + i] = values[i];
  }
}

template <int64_t kind>
void dequantize_rows(at::Tensor& out, const at::Tensor& blocks, const float* scales) {
  const int64_t n = out.size(0), k = out.size(1), per_row = k / kBlock;
  constexpr int64_t bytes = block_bytes(kind);
  const uint8_t* weights = blocks.data_ptr<uint8_t>();
  bf16_bits* out_bf16 = out.scalar_type() == at::kBFloat16 ? ptr<bf16_bits>(out) : nullptr;
  float* out_float = out_bf16 ? nullptr : ptr<float>(out);
  const int64_t row_bytes = blocks.size(1);
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    int32_t q[kBlock];
    float values[kBlock];
    for (int64_t j = begin; j < end; ++j) {
      const float scale = scales ? scales[j] : 1.f;
      for (int64_t b = 0; b < per_row; ++b) {
        const BlockView block = view_block<kind>(weights + j * row_bytes + b * bytes);
        const float d = block.d * scale, m = block.m * scale;
        if constexpr (kind == FP8_ROWS) {
          for (int64_t i = 0; i < kBlock; ++i) values[i] = fp8_e4m3_value(block.q[i]) * scale;
        } else if constexpr (kind == Q5_0) {  // gguf's d * (q - 16), a zero's sign included
          unpack_block<kind>(block, q);
          for (int64_t i = 0; i < kBlock; ++i) values[i] = d * static_cast<float>(q[i] - 16);
        } else {
          unpack_block<kind>(block, q);
          for (int64_t i = 0; i < kBlock; ++i) values[i] = d * static_cast<float>(q[i]) + m;
        }
        store_block(out_bf16, out_float, j * k + b * kBlock, values);
      }
    }
  });
}

template <int64_t kind>
void dequantize_super_rows(at::Tensor& out, const at::Tensor& blocks, const float* scales) {
  constexpr int64_t bytes = block_bytes(kind), subs = gguf_blocks::kSubBlocks;
  const int64_t n = out.size(0), k = out.size(1), per_row = k / block_columns(kind);
  const uint8_t* weights = blocks.data_ptr<uint8_t>();
  bf16_bits* out_bf16 = out.scalar_type() == at::kBFloat16 ? ptr<bf16_bits>(out) : nullptr;
  float* out_float = out_bf16 ? nullptr : ptr<float>(out);
  const int64_t row_bytes = blocks.size(1);
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    int32_t q[kBlock];
    float values[kBlock];
    gguf_blocks::SuperScales decoded;
    for (int64_t r = begin; r < end; ++r) {
      const float scale = scales ? scales[r] : 1.f;
      for (int64_t b = 0; b < per_row; ++b) {
        const uint8_t* block = weights + r * row_bytes + b * bytes;
        gguf_blocks::decode_scales<kind == Q6_K>(block, decoded);
        for (int64_t j = 0; j < subs; ++j) {
          unpack_sub_block<kind>(block, j, q);
          const float m = decoded.m[j] * scale;
          for (int64_t i = 0; i < kBlock; ++i) {
            const float value = decoded.d[2 * j + i / 16] * scale * static_cast<float>(q[i]);
            values[i] = kind == Q6_K ? value : value + m;  // Q6_K: gguf's d * q, no offset
          }
          store_block(out_bf16, out_float, r * k + (b * subs + j) * kBlock, values);
        }
      }
    }
  });
}

}  // namespace

// out[m, n] = sum_k x[m, k] * w[n, k] (* row_scale[n] when given); out float32 or bfloat16.
void quantized_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& blocks, int64_t kind,
                      const c10::optional<at::Tensor>& row_scale) {
  const int64_t rows = x.size(0), k = x.size(1), n = blocks.size(0);
  check_blocks(blocks, kind, k);
  TORCH_CHECK(kind != FP8_ROWS, "quantized_linear: fp8 rows are dequantized, not multiplied here");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "quantized_linear: x must be contiguous [rows, k]");
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.is_contiguous() && out.size(0) == rows && out.size(1) == n,
              "quantized_linear: out must be a contiguous float32 or bfloat16 [rows, n]");
  const QuantizedRows xq = x.scalar_type() == at::kBFloat16 ? quantize_rows<bf16_bits>(x)
                                                             : quantize_rows<float>(x.to(at::kFloat));
  const float* scales = row_scale.has_value() ? row_scale->data_ptr<float>() : nullptr;
  switch (kind) {
    case Q4_0: return linear_rows<Q4_0>(out, xq, blocks, scales, k);
    case Q4_1: return linear_rows<Q4_1>(out, xq, blocks, scales, k);
    case Q5_0: return linear_rows<Q5_0>(out, xq, blocks, scales, k);
    case Q5_1: return linear_rows<Q5_1>(out, xq, blocks, scales, k);
    case Q8_0: return linear_rows<Q8_0>(out, xq, blocks, scales, k);
    case Q4_K: return linear_rows<Q4_K>(out, xq, blocks, scales, k);
    case Q5_K: return linear_rows<Q5_K>(out, xq, blocks, scales, k);
    case Q6_K: return linear_rows<Q6_K>(out, xq, blocks, scales, k);
    case Q4_F32: return linear_rows<Q4_F32>(out, xq, blocks, scales, k);
    default: return linear_rows<INT8_ROWS>(out, xq, blocks, scales, k);
  }
}

// The weights as floats (float32 or bfloat16 `out`, [rows, k]), e.g. for a GEMM on many rows.
void dequantize_blocks(at::Tensor& out, const at::Tensor& blocks, int64_t kind,
                       const c10::optional<at::Tensor>& row_scale) {
  check_blocks(blocks, kind, out.size(1));
  TORCH_CHECK(out.is_contiguous() && blocks.size(0) == out.size(0),
              "dequantize_blocks: out must be contiguous [rows, k]");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kFloat,
              "dequantize_blocks: out must be float32 or bfloat16");
  const float* scales = row_scale.has_value() ? row_scale->data_ptr<float>() : nullptr;
  switch (kind) {
    case Q4_0: return dequantize_rows<Q4_0>(out, blocks, scales);
    case Q4_1: return dequantize_rows<Q4_1>(out, blocks, scales);
    case Q5_0: return dequantize_rows<Q5_0>(out, blocks, scales);
    case Q5_1: return dequantize_rows<Q5_1>(out, blocks, scales);
    case Q8_0: return dequantize_rows<Q8_0>(out, blocks, scales);
    case Q4_K: return dequantize_super_rows<Q4_K>(out, blocks, scales);
    case Q5_K: return dequantize_super_rows<Q5_K>(out, blocks, scales);
    case Q6_K: return dequantize_super_rows<Q6_K>(out, blocks, scales);
    case Q4_F32: return dequantize_rows<Q4_F32>(out, blocks, scales);
    case FP8_ROWS: return dequantize_rows<FP8_ROWS>(out, blocks, scales);
    default: return dequantize_rows<INT8_ROWS>(out, blocks, scales);
  }
}

}  // namespace octavo_cpu
