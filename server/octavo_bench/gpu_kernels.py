"""``python -m octavo_bench gpu``'s kernel part: each Triton kernel against the torch path.

Same inputs to both; the report keeps the time per call of each (CUDA events, after a
warm-up) and the largest absolute difference. Shapes are a 1B-class model's decode
(32 query heads, 8 KV heads of 128, 32 sequences of 1,024 context) and its gated MLP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from octavo.attention.backend import TorchAttention
from octavo.attention.triton_backend import TritonAttention
from octavo.model_executor.step_inputs import lay_out, step_inputs
from octavo.scheduler.output import ScheduledSequence


@dataclass(frozen=True)
class KernelResult:
    name: str
    triton_ms: float
    torch_ms: float
    max_abs_diff: float
    max_reference: float  # the largest |value| the torch path gave: the scale of the diff

    @property
    def speedup(self) -> float:
        return self.torch_ms / self.triton_ms if self.triton_ms > 0 else 0.0

    @property
    def max_rel_diff(self) -> float:
        """The largest difference relative to the output's scale (bf16 rounds at 2**-8)."""
        return self.max_abs_diff / self.max_reference if self.max_reference > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "speedup": self.speedup, "max_rel_diff": self.max_rel_diff}


def time_ms(fn: Callable[[], torch.Tensor], repeats: int = 20) -> float:
    """Mean milliseconds per call on the GPU (CUDA events), after three warm-up calls."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def decode_attention(
    device: torch.device, dtype: torch.dtype, seqs: int = 32, context: int = 1024
) -> KernelResult:
    """Paged decode attention, one query token per sequence over ``context`` cached ones."""
    heads, kv_heads, head_dim, block_size = 32, 8, 128, 16
    blocks_each = context // block_size
    scheduled = [
        ScheduledSequence(
            i, [0], context - 1, list(range(1 + i * blocks_each, 1 + (i + 1) * blocks_each)), True
        )
        for i in range(seqs)
    ]
    meta = step_inputs(lay_out(scheduled, block_size), 0, device).meta
    cache_shape = (2, 1 + seqs * blocks_each, block_size, kv_heads, head_dim)
    cache = torch.randn(cache_shape, dtype=dtype, device=device)
    query = torch.randn(seqs, heads, head_dim, dtype=dtype, device=device)
    key, value = (torch.randn(seqs, kv_heads, head_dim, dtype=dtype, device=device) for _ in "kv")
    scale = head_dim**-0.5

    def run(backend) -> Callable[[], torch.Tensor]:
        return lambda: backend.forward(query, key, value, cache, meta, scale)

    return compare("paged decode attention", run(TritonAttention()), run(TorchAttention()))


def gated_activation(device: torch.device, dtype: torch.dtype, rows: int = 256) -> KernelResult:
    """SiLU(gate) * up over an 8,192-wide intermediate (Triton kernel vs torch ops)."""
    from octavo.model_executor.layers.triton_activation import gated_activation_triton

    x = torch.randn(rows, 2 * 8192, dtype=dtype, device=device)

    def reference() -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    return compare("SiLU and mul", lambda: gated_activation_triton(x, "silu"), reference)


def compare(name: str, triton_fn, torch_fn) -> KernelResult:
    reference = torch_fn().float()
    difference = (triton_fn().float() - reference).abs().max().item()
    scale = reference.abs().max().item()
    return KernelResult(name, time_ms(triton_fn), time_ms(torch_fn), difference, scale)


def all_kernels(device: torch.device, dtype: torch.dtype) -> list[KernelResult]:
    return [decode_attention(device, dtype), gated_activation(device, dtype)]
