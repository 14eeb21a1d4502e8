"""Compile the engine's Triton kernels for a GPU without one: run as a child process.

The unit suite runs the kernels under ``TRITON_INTERPRET``, which executes them with NumPy
and so never meets what only the GPU compiler checks: the operand types ``tl.dot`` takes
on tensor cores, layouts, and the shared memory a kernel's tiles and pipeline stages take
(a launch asking for more than the GPU has fails with "out of resource"). Here each
launch the engine makes on a GPU is compiled for real (Triton to LLVM to PTX, then the
Triton wheel's own ``ptxas`` to a cubin) for the compute capability given: the launchers
are called with CPU tensors, a stand-in driver names the target, and nothing is launched.
Where a launcher decides by the device (the prefill's ``tl.dot`` operand type, the SM
count), it is given a CUDA device's answer.

    TRITON_INTERPRET=0 python tests/triton_gpu_compile.py 90 "89=attention bf16, blocks of 128"

(a capability alone: every case). Prints one JSON line per compiled kernel: target, case,
kernel, shared memory bytes and the target's limit, warps, stages; one per case that failed:
target, case, error.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    raise SystemExit("run with TRITON_INTERPRET=0: interpreted kernels are not compiled")

import torch
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from octavo.attention import triton_decode, triton_kernels
from octavo.attention.kv_quant import KVScales
from octavo.attention.options import AttentionOptions
from octavo.model_executor import triton_rotary
from octavo.model_executor.layers import lora_kernels, triton_activation, triton_norm
from octavo.model_executor.layers.moe import triton_fused_moe
from octavo.model_executor.layers.quantization import triton_fp8_blocks
from octavo.model_executor.layers.quantization import triton_kernels as quant_kernels
from octavo.model_executor.layers.quantization.fp8_blocks import Fp8BlockTensor
from octavo.sampling import top_p_triton

SM_COUNT = 132  # an H100 / H200: the decode launch's split count reads it
# Shared memory a program may take (the opt-in maximum) by compute capability: T4; A100;
# A10, RTX 30xx; L4, L40S, RTX 40xx; H100, H200. The split decode's tile reads it.
SHARED_MEMORY_LIMITS = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448}
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
FP8 = torch.float8_e4m3fn
# Llama-3-8B's attention: 32 query heads, 8 KV heads of 128; a few tokens are enough,
# the kernels are compiled per dtype and constexpr, not per shape.
HEADS, KV_HEADS = 32, 8


class CompileOnlyDriver:
    """What ``JITFunction.run`` asks the active driver for, answered for ``target``."""

    def __init__(self, target: GPUTarget) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return self.target.arch  # Triton keeps a backend per device: one per target here

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target

    def is_active(self) -> bool:
        return True


def compile_only(compiled: list) -> None:
    """``kernel[grid](...)`` compiles (``warmup``) and records the kernel, launching nothing."""

    def getitem(self: JITFunction, grid):
        def launch(*args, **kwargs):
            kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            compiled.append((self.fn.__name__, kernel))
            return kernel

        return launch

    JITFunction.__getitem__ = getitem


def cuda_answers(capability: int) -> None:
    """The launchers' device checks, answered as on a CUDA device of ``capability``."""
    half = {FP16: tl.float16, BF16: tl.bfloat16}
    triton_kernels._dot_dtype = lambda query: half.get(query.dtype, tl.float32)
    triton_decode.sm_count = lambda device: SM_COUNT
    triton_decode.shared_memory_limit = lambda device: SHARED_MEMORY_LIMITS[capability]


def paged_cache(dtype: torch.dtype, block_size: int, head_dim: int = 128) -> torch.Tensor:
    return torch.zeros(2, 8, block_size, KV_HEADS, head_dim).to(dtype)


def attention(
    dtype: torch.dtype,
    cache_dtype: torch.dtype | None = None,
    block_size: int = 16,
    head_dim: int = 128,
    options: AttentionOptions | None = None,
    splits: tuple[int, ...] = (1, 4),
    decode_only: bool = False,
) -> Callable[[], None]:
    """Store, prefill and decode (each split count) over one paged cache."""

    def run() -> None:
        cache = paged_cache(cache_dtype or dtype, block_size, head_dim)
        scales = KVScales(0.5, 0.25) if cache_dtype == FP8 else KVScales()
        extra = {"options": options} if options else {}
        query = torch.randn(6, HEADS, head_dim).to(dtype)
        tables = torch.zeros(2, 8, dtype=torch.int32)
        starts, lengths = torch.tensor([0, 3, 6], dtype=torch.int32), torch.tensor([40, 70])
        if not decode_only:
            key = torch.randn(6, KV_HEADS, head_dim).to(dtype)
            triton_kernels.store_kv(key, key, cache, torch.arange(6), scales)
            triton_kernels.prefill_attention(
                query, cache, tables, starts, lengths.int(), 3, 0.1, scales=scales, **extra
            )
        for splits_count in splits:
            triton_decode.paged_decode_attention(
                query[:2],
                cache,
                tables,
                lengths.int(),
                70,
                0.1,
                None,
                scales,
                **extra,
                num_splits=splits_count,
            )

    return run


def every_option() -> AttentionOptions:
    sinks = torch.zeros(HEADS)
    return AttentionOptions(sliding_window=32, soft_cap=30.0, sinks=sinks, chunk_size=64)


def norm_rotary_activation(dtype: torch.dtype, hidden: int = 4096) -> Callable[[], None]:
    def run() -> None:
        x, weight = torch.randn(3, hidden).to(dtype), torch.ones(hidden).to(dtype)
        triton_norm.rms_norm_triton(x, weight, 1e-5)
        triton_norm.rms_norm_triton(x, weight, 1e-5, residual=torch.randn(3, hidden).to(dtype))
        qk = torch.randn(3, HEADS + KV_HEADS, 128).to(dtype)
        cos = sin = torch.randn(64, 128).to(dtype)
        triton_rotary.rotary_triton(torch.arange(3), qk, cos, sin)
        for kind in triton_activation.KINDS:
            triton_activation.gated_activation_triton(torch.randn(3, 2 * hidden).to(dtype), kind)

    return run


def quantized_linears(dtype: torch.dtype) -> Callable[[], None]:
    """The int4 and fp8 linears at a decode-sized and a prefill-sized row count (tiles
    differ), and fp8 with block scales."""

    def run() -> None:
        n, k = 128, 256
        packed = torch.zeros(n, k // 2, dtype=torch.uint8)
        group_scales = torch.ones(n, k // 128)
        weight, scale = torch.zeros(n, k).to(FP8), torch.ones(n)
        for rows in (4, 64):
            x = torch.randn(rows, k).to(dtype)
            quant_kernels.int4_matmul(x, packed, group_scales.to(dtype), group_scales.to(dtype))
            quant_kernels.fp8_matmul(x, weight, scale)
            blocks = Fp8BlockTensor(weight, torch.ones(1, 2), (128, 128))
            triton_fp8_blocks.fp8_block_linear(x, blocks)

    return run


def lora(dtype: torch.dtype) -> Callable[[], None]:
    def run() -> None:
        x, slots = torch.randn(5, 64).to(dtype), torch.tensor([0, 1, -1, 1, 0], dtype=torch.int32)
        shrunk = lora_kernels.lora_shrink(x, torch.randn(2, 2, 16, 64).to(dtype), slots)
        out = torch.zeros(5, 48).to(dtype)
        lora_kernels.lora_expand(
            out, shrunk, torch.randn(2, 48, 16).to(dtype), slots, (0, 16), (16, 32)
        )

    return run


def mixture_of_experts(dtype: torch.dtype) -> Callable[[], None]:
    def run() -> None:
        experts, size, inner = 4, 64, 32
        hidden = torch.randn(5, size).to(dtype)
        w13, w2 = (
            torch.randn(experts, 2 * inner, size).to(dtype),
            torch.randn(experts, size, inner).to(dtype),
        )
        ids = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2]], dtype=torch.int32)
        weights = torch.full((5, 2), 0.5)
        for activation in triton_fused_moe.ACTIVATIONS:
            bias13, bias2 = (
                torch.zeros(experts, 2 * inner).to(dtype),
                torch.zeros(experts, size).to(dtype),
            )
            triton_fused_moe.fused_moe_triton(
                hidden, w13, w2, weights, ids, activation, bias13, bias2
            )

    return run


def top_p() -> None:
    top_p_triton.triton_thresholds(torch.rand(2, 128256), torch.tensor([0.9, 0.5]))


def split_decode(head_dim: int, block_size: int) -> Callable[[], None]:
    """The split decode alone: what depends on a GPU's shared memory."""
    return attention(BF16, block_size=block_size, head_dim=head_dim, splits=(4,), decode_only=True)


CASES: dict[str, Callable[[], None]] = {
    "attention bf16": attention(BF16),
    "attention bf16, fp8 cache, every option": attention(
        BF16, cache_dtype=FP8, options=every_option()
    ),
    "attention fp32": attention(FP32),
    "attention bf16, blocks of 128": attention(BF16, block_size=128),
    "attention bf16, blocks of 256": attention(BF16, block_size=256),  # FLASH_ATTN's pages
    "split decode, head_dim 256": split_decode(256, 16),
    "split decode, head_dim 256, blocks of 128": split_decode(256, 128),
    "norm, rotary, activation bf16": norm_rotary_activation(BF16),
    "quantized linears bf16": quantized_linears(BF16),
    "lora bf16": lora(BF16),
    "mixture of experts bf16": mixture_of_experts(BF16),
    "top-p thresholds": top_p,
}


def compile_cases(capability: int, names: list[str], compiled: list) -> None:
    """Compile ``names`` for ``capability``, printing a row per kernel or failed case."""
    driver.set_active(CompileOnlyDriver(GPUTarget("cuda", capability, 32)))
    cuda_answers(capability)
    for name in names:
        compiled.clear()
        try:
            CASES[name]()
        except Exception as exc:  # the next cases still compile; the test reports them all
            print(json.dumps({"target": capability, "case": name, "error": repr(exc)}))
        for kernel_name, kernel in compiled:
            meta = kernel.metadata
            row = {"target": capability, "case": name, "kernel": kernel_name}
            row |= {"shared": meta.shared, "limit": SHARED_MEMORY_LIMITS[capability]}
            print(json.dumps({**row, "warps": meta.num_warps, "stages": meta.num_stages}))
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    """Arguments ``CAPABILITY`` (every case) or ``CAPABILITY=CASE``, any number, in order."""
    targets: dict[int, list[str]] = {}
    for argument in argv:
        capability, _, case = argument.partition("=")
        targets.setdefault(int(capability), []).extend([case] if case else list(CASES))
    compiled: list = []
    compile_only(compiled)
    for capability, names in targets.items():
        compile_cases(capability, names, compiled)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
