// The schedule shared by the panel-packed linears (dense_linear.cpp: fp32,
// dense_linear_bf16.cpp: bf16): which register block a row count gets, and how threads
// split the work. A kernel is `Kernel<MR, NP>::run(shape, row, panel, k0, depth, ahead)`:
// MR rows by NP column panels over the input steps k0..k0 + depth (an fp32 input dimension,
// or a pair of bf16 ones), calling ahead.step() once per step. A shape has `rows`, `panels`,
// `depth` (its input steps), `packed` and the kAheadOneBlock / kAheadMostBlocks choices.
//   - a few rows (decode) stream each panel once, front to back, several panels side by
//     side;
//   - many rows (prefill) keep kBigRows x kBigPanels accumulators in registers while a
//     group of panels (a slice of kDepth input steps, in L2) serves every row block;
//   - while a slice's row blocks run, they ask for the next slice's lines, a share each,
//     so that the memory loads overlap the arithmetic instead of taking turns with it (at
//     32 rows that took SmolLM2's step from 16.6 to 11.8 ms in bf16, 27.6 to 23.6 in fp32).
// Threads split the panel groups, and the rows too where the groups alone are too few.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.h"
#include "lanes.h"

namespace octavo_cpu::dense {

#if defined(__AVX512F__)
constexpr int kBigRows = 8, kBigPanels = 3;  // 24 of 32 vector registers hold sums
#else
constexpr int kBigRows = 4, kBigPanels = 3;  // 12 of 16 (6 x 2 ran 3-6 % slower at 12-32 rows)
#endif
constexpr int64_t kDepth = 1024;  // input steps per pass: a group's slice stays in L2

// Rows per register block: at most kBigRows, the blocks as even as they go (AVX-512, 9 rows:
// 5 + 4 with 4 panels, not 8 + 1, whose single row's 3 sums wait on the FMA latency).
constexpr int64_t row_block(int64_t rows) {
  const int64_t blocks = (rows + kBigRows - 1) / kBigRows;
  return (rows + blocks - 1) / blocks;
}

// Panels side by side for blocks of `rows` rows: as many sums as the registers hold.
constexpr int panels_for(int64_t rows) {
  if (rows >= kBigRows) return kBigPanels;
  if (kWidth == 16) return rows <= 6 ? 4 : 3;
  return rows <= 2 ? 4 : 3;
}

// A panel's input step is kWidth 4-byte numbers (fp32, or a bf16 pair): one cache line on
// AVX-512.
constexpr int64_t kStepBytes = kWidth * 4;

// The lines of the next slice that one row block asks for while it runs (a few per input
// step), so that the loads from memory overlap arithmetic on what is already in cache.
// The slice is `panels` stretches of `panel_steps` steps, `stride` bytes apart.
struct Ahead {
  const char* line = nullptr;
  int64_t left = 0, per_step = 0;  // lines still to ask for; at most per_step each step
  int64_t left_in_panel = 0, panel_steps = 0, jump = 0;

  inline void step() {
    for (int64_t i = 0; i < per_step && left > 0; ++i, --left) {
      __builtin_prefetch(line);
      line += kStepBytes;
      if (--left_in_panel == 0) {
        line += jump;
        left_in_panel = panel_steps;
      }
    }
  }
};

// Lines first..first + count of a slice that starts at `start`, asked for over `steps`.
inline Ahead ahead_part(const char* start, int64_t panel_steps, int64_t stride, int64_t first, int64_t count,
                        int64_t steps) {
  Ahead a;
  if (start == nullptr || count <= 0) return a;
  a.line = start + (first / panel_steps) * stride + (first % panel_steps) * kStepBytes;
  a.left = count;
  a.per_step = (count + steps - 1) / steps;
  a.left_in_panel = panel_steps - first % panel_steps;
  a.panel_steps = panel_steps;
  a.jump = stride - panel_steps * kStepBytes;
  return a;
}

template <typename Shape>
using Micro = void (*)(const Shape&, int64_t row, int64_t panel, int64_t k0, int64_t depth, Ahead ahead);

// Where panel `panel`'s slice from input step k0 starts in the packed weights.
template <typename Shape>
const char* slice_start(const Shape& s, int64_t panel, int64_t k0) {
  return reinterpret_cast<const char*>(s.packed) + (panel * s.depth + k0) * kStepBytes;
}

template <typename Shape, template <int, int> class Kernel, int MR>
Micro<Shape> micro_for_panels(int panels) {
  switch (panels) {
    case 1: return Kernel<MR, 1>::run;
    case 2: return Kernel<MR, 2>::run;
    case 3: return Kernel<MR, 3>::run;
    default: return Kernel<MR, 4>::run;
  }
}

template <typename Shape, template <int, int> class Kernel>
Micro<Shape> micro_for(int64_t rows, int panels) {
  switch (rows) {
    case 1: return micro_for_panels<Shape, Kernel, 1>(panels);
    case 2: return micro_for_panels<Shape, Kernel, 2>(panels);
    case 3: return micro_for_panels<Shape, Kernel, 3>(panels);
    case 4: return micro_for_panels<Shape, Kernel, 4>(panels);
    case 5: return micro_for_panels<Shape, Kernel, 5>(panels);
    case 6: return micro_for_panels<Shape, Kernel, 6>(panels);
    case 7: return micro_for_panels<Shape, Kernel, 7>(panels);
    default: return micro_for_panels<Shape, Kernel, 8>(panels);
  }
}

// Rows first_row..end_row by `panels` panels from `panel`, slice by slice. The first row
// block reads a slice from memory and the others find it in cache; meanwhile every block
// asks for its share of the next slice (this group's, or the first of `next_panels` panels
// from `next_panel`: none where next_panels is 0), where the shape's kernel gains by it:
// a single block of at least Shape::kAheadOneBlock rows, or 2..Shape::kAheadMostBlocks.
template <typename Shape, template <int, int> class Kernel>
void run_group(const Shape& s, int64_t panel, int panels, int64_t first_row, int64_t end_row, int64_t next_panel,
               int64_t next_panels) {
  const int64_t block = row_block(s.rows);
  const int64_t blocks = (end_row - first_row + block - 1) / block;
  for (int64_t k0 = 0; k0 < s.depth; k0 += kDepth) {
    const int64_t depth = std::min(kDepth, s.depth - k0);
    const bool last = k0 + kDepth >= s.depth;
    const char* next = !last ? slice_start(s, panel, k0 + kDepth) : next_panels ? slice_start(s, next_panel, 0) : nullptr;
    const int64_t next_steps = !last ? std::min(kDepth, s.depth - k0 - kDepth) : std::min(kDepth, s.depth);
    const int64_t lines = (last ? next_panels : panels) * next_steps;
    const bool ask = blocks == 1 ? end_row - first_row >= Shape::kAheadOneBlock : blocks <= Shape::kAheadMostBlocks;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t row = first_row + b * block, rows = std::min(block, end_row - row);
      const int64_t first = b * lines / blocks, count = ask ? (b + 1) * lines / blocks - first : 0;
      const Ahead ahead = ahead_part(next, next_steps, s.depth * kStepBytes, first, count, depth);
      micro_for<Shape, Kernel>(rows, panels)(s, row, panel, k0, depth, ahead);
    }
  }
}

template <typename Shape, template <int, int> class Kernel>
void run_panels(const Shape& s) {
  const int64_t block = row_block(s.rows);
  const int group = panels_for(block);
  const int64_t groups = (s.panels + group - 1) / group;
  const int64_t row_blocks = (s.rows + block - 1) / block;
  const int64_t threads = at::get_num_threads();
  // Rows are split too only where the panel groups alone leave threads idle.
  const int64_t row_parts = groups >= 2 * threads ? 1 : std::min(row_blocks, (2 * threads + groups - 1) / groups);
  const int64_t blocks_per_part = (row_blocks + row_parts - 1) / row_parts;
  at::parallel_for(0, groups * row_parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / row_parts, part = task % row_parts;
      const int64_t first_row = part * blocks_per_part * block;
      const int64_t end_row = std::min(s.rows, first_row + blocks_per_part * block);
      const int panels = static_cast<int>(std::min<int64_t>(group, s.panels - g * group));
      // The next task's panels, where it is this thread's and reads other weights.
      const int64_t next_group = (task + 1) / row_parts;
      const int64_t next_panels = task + 1 < end && next_group != g ? std::min<int64_t>(group, s.panels - next_group * group) : 0;
      if (first_row < end_row)
        run_group<Shape, Kernel>(s, g * group, panels, first_row, end_row, next_group * group, next_panels);
    }
  });
}

// kWidth columns from `first` of a row of `cols` (fp32, or bf16 widened; zeros past the end).
template <typename T>
inline lanes_t load_cols(const T* row, int64_t first, int64_t cols) {
  if (first + kWidth <= cols) return load_lanes(row + first);
  alignas(64) T part[kWidth] = {};
  std::memcpy(part, row + first, (cols - first) * sizeof(T));
  return load_lanes(part);
}

inline void store_cols(float* row, int64_t first, int64_t cols, lanes_t value) {
  if (first + kWidth <= cols) return store_lanes(row + first, value);
  alignas(64) float part[kWidth];
  store_lanes(part, value);
  std::memcpy(row + first, part, (cols - first) * sizeof(float));
}

}  // namespace octavo_cpu::dense
