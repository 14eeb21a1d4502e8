// Registers Octavo's CPU kernels as torch.ops.octavo_cpu.*.
#include <torch/library.h>

#include "common.h"

namespace octavo_cpu {
void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps);
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
void silu_and_mul(at::Tensor& out, const at::Tensor& x);
void rotary_embedding(const at::Tensor& positions, at::Tensor& qk, const at::Tensor& cos, const at::Tensor& sin);
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache, const at::Tensor& slot_mapping,
              double k_scale, double v_scale);
void paged_decode_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale, double k_scale,
                            double v_scale, int64_t window, double soft_cap, const c10::optional<at::Tensor>& sinks);
void paged_prefill_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                             const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                             const at::Tensor& seq_lens, double scale, double k_scale, double v_scale, int64_t window,
                             double soft_cap, const c10::optional<at::Tensor>& sinks);
void shm_all_reduce(at::Tensor& tensor, at::Tensor& segment, int64_t rank, int64_t world,
                    int64_t call, int64_t slot_bytes);
void apply_token_bitmask(at::Tensor& logits, const at::Tensor& bitmask, const at::Tensor& rows);
void shm_publish(const at::Tensor& tensor, at::Tensor& segment, int64_t rank, int64_t world,
                 int64_t call, int64_t slot_bytes);
void quantized_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& blocks, int64_t kind,
                      const c10::optional<at::Tensor>& row_scale);
void dequantize_blocks(at::Tensor& out, const at::Tensor& blocks, int64_t kind,
                       const c10::optional<at::Tensor>& row_scale);
void lora_delta(at::Tensor& out, const at::Tensor& x, const at::Tensor& flat_a, const at::Tensor& block_b,
                const at::Tensor& row_slots, at::IntArrayRef offsets, at::IntArrayRef sizes);
int64_t dense_panel_width();
bool dense_amx_enabled();
std::string dense_bf16_path(int64_t rows, int64_t in_features);
void pack_dense_weight(at::Tensor& packed, const at::Tensor& weight);
void dense_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias);
}  // namespace octavo_cpu

TORCH_LIBRARY(octavo_cpu, m) {
  m.def("rms_norm(Tensor(a!) out, Tensor x, Tensor weight, float eps) -> ()");
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("silu_and_mul(Tensor(a!) out, Tensor x) -> ()");
  m.def("rotary_embedding(Tensor positions, Tensor(a!) qk, Tensor cos, Tensor sin) -> ()");
  m.def(
      "store_kv(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping, float k_scale=1., "
      "float v_scale=1.) -> ()");
  m.def(
      "paged_decode_attention(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor block_tables, "
      "Tensor seq_lens, float scale, float k_scale=1., float v_scale=1., int window=0, "
      "float soft_cap=0., Tensor? sinks=None) -> ()");
  m.def(
      "paged_prefill_attention(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor block_tables, "
      "Tensor query_start_loc, Tensor seq_lens, float scale, float k_scale=1., float v_scale=1., "
      "int window=0, float soft_cap=0., Tensor? sinks=None) -> ()");
  m.def(
      "shm_all_reduce(Tensor(a!) tensor, Tensor(b!) segment, int rank, int world, int call, "
      "int slot_bytes) -> ()");
  m.def("apply_token_bitmask(Tensor(a!) logits, Tensor bitmask, Tensor rows) -> ()");
  m.def("quantized_linear(Tensor(a!) out, Tensor x, Tensor blocks, int kind, Tensor? row_scale) -> ()");
  m.def("dequantize_blocks(Tensor(a!) out, Tensor blocks, int kind, Tensor? row_scale) -> ()");
  m.def(
      "lora_delta(Tensor(a!) out, Tensor x, Tensor flat_a, Tensor block_b, Tensor row_slots, "
      "int[] offsets, int[] sizes) -> ()");
  m.def("dense_panel_width() -> int", &octavo_cpu::dense_panel_width);  // no tensors: no dispatch key
  m.def("dense_amx_enabled() -> bool", &octavo_cpu::dense_amx_enabled);  // bf16 linears on AMX tiles here
  m.def("dense_bf16_path(int rows, int in_features) -> str", &octavo_cpu::dense_bf16_path);  // amx/vdpbf16ps/widened
  m.def("pack_dense_weight(Tensor(a!) packed, Tensor weight) -> ()");
  m.def("dense_linear(Tensor(a!) out, Tensor x, Tensor packed, Tensor? bias) -> ()");
  m.def(
      "shm_publish(Tensor tensor, Tensor(a!) segment, int rank, int world, int call, "
      "int slot_bytes) -> ()");
}

TORCH_LIBRARY_IMPL(octavo_cpu, CPU, m) {
  m.impl("rms_norm", &octavo_cpu::rms_norm);
  m.impl("fused_add_rms_norm", &octavo_cpu::fused_add_rms_norm);
  m.impl("silu_and_mul", &octavo_cpu::silu_and_mul);
  m.impl("rotary_embedding", &octavo_cpu::rotary_embedding);
  m.impl("store_kv", &octavo_cpu::store_kv);
  m.impl("paged_decode_attention", &octavo_cpu::paged_decode_attention);
  m.impl("paged_prefill_attention", &octavo_cpu::paged_prefill_attention);
  m.impl("shm_all_reduce", &octavo_cpu::shm_all_reduce);
  m.impl("shm_publish", &octavo_cpu::shm_publish);
  m.impl("apply_token_bitmask", &octavo_cpu::apply_token_bitmask);
  m.impl("quantized_linear", &octavo_cpu::quantized_linear);
  m.impl("dequantize_blocks", &octavo_cpu::dequantize_blocks);
  m.impl("lora_delta", &octavo_cpu::lora_delta);
  m.impl("pack_dense_weight", &octavo_cpu::pack_dense_weight);
  m.impl("dense_linear", &octavo_cpu::dense_linear);
}
