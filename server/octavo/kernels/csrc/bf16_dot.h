// The bf16 dot-product instructions (AVX512_BF16's vdpbf16ps: two bf16 products added to
// an fp32 lane), used by the attention kernels' bf16 paths inside the AVX-512 build: code
// compiled for them with OCTAVO_BF16_TARGET runs only where `bf16_dot_enabled()` says so.
#pragma once

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

// Whether the bf16 paths run: the CPU has the instructions and OCTAVO_CPU_BF16_DOT is not 0
// (read at each call, so a test can run the fp32 paths on the same machine).
inline bool bf16_dot_enabled() {
  const char* setting = std::getenv("OCTAVO_CPU_BF16_DOT");
  return cpu_has_avx512_bf16() && !(setting != nullptr && std::strcmp(setting, "0") == 0);
}
#else
inline bool bf16_dot_enabled() { return false; }
#endif

}  // namespace octavo_cpu
