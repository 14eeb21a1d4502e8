// All-reduce (sum) between the tensor-parallel worker processes of one machine through a
// shared-memory segment, as vLLM's CPU backend does: gloo's TCP loopback costs about a
// millisecond per call, this costs a copy, a flag and a sum.
//
// Segment layout: one 64-byte line per rank holding its latest call number, then two
// buffers (calls alternate between them) of `world` slots of `slot_bytes` each. A call:
// copy this rank's tensor into its slot, publish the call number (release), wait until
// every rank has published it (acquire), then sum the slots in rank order, so every rank
// computes bit-identical results. A slot is written again two calls later, by which time
// every rank has finished reading it (it had to reach the call in between).
#include <sched.h>

#include <atomic>
#include <cstring>

#include "common.h"

namespace octavo_cpu {
namespace {

constexpr int64_t kLine = 64;
constexpr int kSpinsBeforeYield = 2048;

int64_t* flag_of(uint8_t* base, int64_t rank) {
  return reinterpret_cast<int64_t*>(base + rank * kLine);
}

void wait_for_all(uint8_t* base, int64_t world, int64_t call) {
  for (int64_t rank = 0; rank < world; ++rank) {
    std::atomic_ref<int64_t> flag(*flag_of(base, rank));
    int spins = 0;
    while (flag.load(std::memory_order_acquire) < call) {
      if (++spins < kSpinsBeforeYield) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      } else {
        sched_yield();  // more workers than cores: let the others run
      }
    }
  }
}

template <typename T>
void sum_slots(T* out, uint8_t* first_slot, int64_t world, int64_t slot_bytes, int64_t count) {
  at::parallel_for(0, count, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float total = 0.f;
      for (int64_t rank = 0; rank < world; ++rank) {
        total += to_float(reinterpret_cast<const T*>(first_slot + rank * slot_bytes)[i]);
      }
      out[i] = from_float<T>(total);
    }
  });
}

}  // namespace

// Copy `tensor` into this rank's slot of call `call`'s buffer, publish it, and wait until
// every rank has published theirs; returns the buffer (the slots of ranks 0..world-1).
uint8_t* publish(const at::Tensor& tensor, at::Tensor& segment, int64_t rank, int64_t world,
                 int64_t call, int64_t slot_bytes) {
  TORCH_CHECK(tensor.is_contiguous(), "shared-memory exchange: the tensor must be contiguous");
  const int64_t bytes = tensor.numel() * tensor.element_size();
  TORCH_CHECK(bytes <= slot_bytes, "shared-memory exchange: tensor larger than a slot");
  TORCH_CHECK(segment.numel() >= kLine * world + 2 * world * slot_bytes, "segment too small");
  uint8_t* base = segment.data_ptr<uint8_t>();
  uint8_t* buffer = base + kLine * world + (call & 1) * world * slot_bytes;
  std::memcpy(buffer + rank * slot_bytes, tensor.data_ptr(), bytes);
  std::atomic_ref<int64_t>(*flag_of(base, rank)).store(call, std::memory_order_release);
  wait_for_all(base, world, call);
  return buffer;
}

// Every rank's tensor is in the segment once this returns (a gather reads the slots).
void shm_publish(const at::Tensor& tensor, at::Tensor& segment, int64_t rank, int64_t world,
                 int64_t call, int64_t slot_bytes) {
  publish(tensor, segment, rank, world, call, slot_bytes);
}

void shm_all_reduce(at::Tensor& tensor, at::Tensor& segment, int64_t rank, int64_t world,
                    int64_t call, int64_t slot_bytes) {
  uint8_t* buffer = publish(tensor, segment, rank, world, call, slot_bytes);
  const int64_t count = tensor.numel();
  if (tensor.scalar_type() == at::kFloat) {
    sum_slots(ptr<float>(tensor), buffer, world, slot_bytes, count);
  } else if (tensor.scalar_type() == at::kBFloat16) {
    sum_slots(ptr<bf16_bits>(tensor), buffer, world, slot_bytes, count);
  } else {
    TORCH_CHECK(false, "shm_all_reduce: float32 or bfloat16 only");
  }
}

}  // namespace octavo_cpu
