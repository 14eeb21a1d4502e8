// The bf16 dot-product instructions (AVX512_BF16's vdpbf16ps: two bf16 products added to
// an fp32 lane), used by the attention kernels' bf16 paths inside the AVX-512 build: code
// compiled for them with OCTAVO_BF16_TARGET runs only where `bf16_dot_enabled()` says so.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>

#define OCTAVO_BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")))
#endif

namespace octavo_cpu {

#if defined(__AVX512F__)
inline bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

// OCTAVO_CPU_BF16_DOT as set: "0", "1", or nullptr (read at each call, so a test can run
// either path on the same machine).
inline const char* bf16_dot_setting() { return std::getenv("OCTAVO_CPU_BF16_DOT"); }

// Whether the bf16 paths run: the CPU has the instructions and OCTAVO_CPU_BF16_DOT is not 0.
inline bool bf16_dot_enabled() {
  const char* setting = bf16_dot_setting();
  return cpu_has_avx512_bf16() && !(setting != nullptr && std::strcmp(setting, "0") == 0);
}

// Whether a bf16 product over `rows` rows at a time (a linear's input rows, a prefill
// tile's query rows) multiplies with vdpbf16ps rather than widening to fp32 FMAs. On Intel
// cores vdpbf16ps does a pair of multiply-adds at about half the rate of two 512-bit FMAs
// (an Intel Xeon without AMX, 2 vCPUs, SmolLM2's step: 32 rows 49.0 vs 37.7 ms widened,
// 256 rows 383 vs 320, 1,024 rows 1,641 vs 1,101; 1-2 rows, read from memory, alike; its
// prefill attention over 512 tokens 1.99 vs 1.22-1.53 ms on the fp32 tile), so there they
// widen from 2 rows; OCTAVO_CPU_BF16_DOT=1 keeps vdpbf16ps. On AMD (Zen 4, Zen 5) it runs
// at the FMA rate and does twice the work an FMA does (Zen 5: 256 rows 79.6 ms against 170
// in fp32).
inline bool bf16_dot_for_rows(int64_t rows) {
  static const bool intel = __builtin_cpu_is("intel");
  const char* setting = bf16_dot_setting();
  if (!bf16_dot_enabled()) return false;
  return (setting != nullptr && std::strcmp(setting, "1") == 0) || !intel || rows < 2;
}
#else
inline bool bf16_dot_enabled() { return false; }
inline bool bf16_dot_for_rows(int64_t) { return false; }
#endif

}  // namespace octavo_cpu
