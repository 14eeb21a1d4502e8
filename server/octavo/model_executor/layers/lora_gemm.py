"""The two GEMMs of a LoRA layer's torch path: oneDNN-prepacked where the model's own
linears are prepacked (``linear_method.can_pack``), else plain fp32.

The shrink multiplies every row by every slot's A (rows ordered slice, slot, rank); the
expand multiplies the masked result by the block matrix of every slot's B and adds it
to the base output in the same oneDNN call. Measured on 2 Xeon cores (AMX), a decode
step of SmolLM2 with one rank-16 q/k/v/o adapter: plain fp32 GEMMs 39.8 ms, packed bf16
38.2 ms (base 33 ms); a prepacked call costs about 20 µs however small, so the path
keeps two calls per layer whatever the number of adapters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.model_executor.layers.linear_method import can_pack


@dataclass(frozen=True)
class LoRAGemms:
    shrink_t: torch.Tensor  # fp32 [in, slice * slot * rank]
    expand: torch.Tensor  # fp32 [slice * slot * rank, out]
    packed: tuple[torch.Tensor, torch.Tensor] | None  # oneDNN, activation dtype

    @classmethod
    def of(cls, flat_a: torch.Tensor, block_b: torch.Tensor, dtype: torch.dtype) -> LoRAGemms:
        """From the fp32 ``flat_a`` [slice, slot, rank, in] and ``block_b`` [..., out], for
        activations of ``dtype``."""
        shrink = flat_a.view(-1, flat_a.shape[-1])
        expand = block_b.view(-1, block_b.shape[-1])
        if not can_pack(dtype, flat_a.device):
            return cls(shrink.T.contiguous(), expand, None)
        reorder = torch.ops.mkldnn._reorder_linear_weight
        expand_t = expand.T.contiguous().to(dtype)
        packed = (reorder(shrink.to(dtype), None), reorder(expand_t, None))
        return cls(shrink[:0], expand[:0], packed)  # the fp32 copies are not needed

    @property
    def dtype(self) -> torch.dtype:
        """What ``shrink`` returns (and its mask must be)."""
        return torch.float32 if self.packed is None else self.packed[0].dtype

    def shrink(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[rows, slice * slot * rank] times ``mask`` (fused into the oneDNN call)."""
        if self.packed is None:
            return (x.float() @ self.shrink_t).mul_(mask)
        return torch.ops.mkldnn._linear_pointwise.binary(x, mask, self.packed[0], None, "mul")

    def expand_into(self, out: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """``out`` plus ``own`` times every B."""
        if self.packed is None:
            return out.add_(own @ self.expand)
        binary = torch.ops.mkldnn._linear_pointwise.binary
        return binary(own, out, self.packed[1], None, "add")
