// Intel AMX tiles for the bf16 kernels of the AVX-512 build: eight tile registers of up to
// 16 rows x 64 bytes, and tdpbf16ps, which multiplies a tile of bf16 rows by a tile of bf16
// pairs ("VNNI" layout: row i holds, for each output column, the pair of inputs 2i, 2i + 1)
// into a tile of fp32 sums: 16 x 16 x 32 multiply-adds per instruction, 8x vdpbf16ps's.
// Code compiled with OCTAVO_AMX_TARGET runs only where `amx_enabled()` says so: the CPU has
// AMX-BF16 and AMX-TILE, Linux has granted this process the tile state
// (arch_prctl(ARCH_REQ_XCOMP_PERM)), and OCTAVO_CPU_AMX is not 0 (read at each call, so a
// test can run the other paths on the same machine).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__AVX512F__) && defined(__linux__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define OCTAVO_HAS_AMX 1
#define OCTAVO_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")))

namespace octavo_cpu {

inline bool amx_bf16_usable() {
  static const bool usable = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool bf16 = (d >> 22) & 1u, tile = (d >> 24) & 1u;
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return bf16 && tile && syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return usable;
}

inline bool amx_enabled() {
  const char* setting = std::getenv("OCTAVO_CPU_AMX");
  return !(setting != nullptr && std::strcmp(setting, "0") == 0) && amx_bf16_usable();
}

// ldtilecfg's 64-byte operand (palette 1): each tile's rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes[16] = {};
  uint8_t rows[16] = {};

  void set(int tile, int tile_rows, int row_bytes) {
    rows[tile] = static_cast<uint8_t>(tile_rows);
    bytes[tile] = static_cast<uint16_t>(row_bytes);
  }
};

// Every tile register whole: 16 rows of 64 bytes (what the prefill and linear kernels use).
inline TileConfig full_tile_config() {
  TileConfig config;
  for (int tile = 0; tile < 8; ++tile) config.set(tile, 16, 64);
  return config;
}

// ldtilecfg of `config`. GCC does not see the instruction read the config's memory: a config
// filled with values known only at run time lost its stores (every tile left unconfigured,
// and the first tile instruction faulted) until this barrier made them happen first.
__attribute__((target("amx-tile"))) inline void load_tile_config(const TileConfig& config) {
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

}  // namespace octavo_cpu
#else
namespace octavo_cpu {
inline bool amx_enabled() { return false; }
}  // namespace octavo_cpu
#endif
