"""Copying one MoE block's checkpoint tensors into ``FusedMoE``'s stacked experts.

Names are relative to the block (``gate.weight``, ``experts.3.up_proj.weight``, ...), in
the convention an ``ExpertNames`` describes. Each rank reads only its part of a tensor:
its experts (expert parallel) or its slice of the intermediate dimension (tensor
parallel). Bookkeeping slots (``expected_keys``) let the model loader name what a
checkpoint lacks: the router's tensors by their names, each local expert's projections
as ``experts.{e}.gate`` / ``.up`` / ``.down`` (and ``_bias``).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.checkpoint_slice import materialize
from octavo.model_executor.layers.linear import copy_checked
from octavo.model_executor.layers.moe.mxfp4 import BLOCK_VALUES, dequantize_mxfp4
from octavo.model_executor.layers.moe.mxfp4_experts import load_kept_mxfp4
from octavo.model_executor.layers.moe.names import ExpertNames
from octavo.model_executor.layers.moe.placement import ExpertPlacement
from octavo.model_executor.layers.quantization.stored_matrix import StoredMatrix

MXFP4_PARTS = ("_blocks", "_scales")


def read_part(tensor, dim: int, start: int, length: int) -> torch.Tensor:
    """``length`` items of ``dim`` from ``start``, reading no more than that from disk."""
    if start == 0 and length == tensor.shape[dim]:
        return tensor if isinstance(tensor, StoredMatrix) else materialize(tensor)
    return tensor.narrow(dim, start, length)


def check_shape(tensor, expected: tuple[int, ...], name: str) -> None:
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {expected}")


class ExpertCheckpoint:
    def __init__(self, names: ExpertNames, placement: ExpertPlacement, hidden_size: int) -> None:
        self.names, self.placement, self.hidden_size = names, placement, hidden_size
        self.per_expert: dict[str, tuple[int, str]] = {}  # checkpoint name -> (expert, part)
        if not names.fused:
            for expert in range(placement.num_experts):
                for part in ("gate", "up", "down"):
                    name = getattr(names, part).format(e=expert)
                    self.per_expert[name] = (expert, part)
        self.pending: dict[str, dict[str, torch.Tensor]] = {}  # MXFP4 halves awaiting the other

    def expected_keys(self, bias: bool, router_bias: bool) -> set[str]:
        keys = {self.names.router_weight}
        if router_bias:
            keys.add(self.names.router_bias)
        parts = ("gate", "up", "down") + (("gate_bias", "up_bias", "down_bias") if bias else ())
        keys.update(f"experts.{e}.{p}" for e in self.placement.local_experts for p in parts)
        return keys

    def slots(self, *parts: str) -> list[str]:
        return [f"experts.{e}.{p}" for e in self.placement.local_experts for p in parts]

    def load(self, moe: nn.Module, name: str, tensor) -> list[str]:
        names = self.names
        if name == names.router_weight:
            copy_checked(moe.router.weight, tensor, name)
            return [name]
        if name == names.router_bias and moe.router.bias is not None:
            copy_checked(moe.router.bias, tensor, name)
            return [name]
        score_bias = moe.router.e_score_correction_bias
        if name == names.router_score_bias and score_bias is not None:
            copy_checked(score_bias, tensor, name)
            return [name]
        if name in self.per_expert:
            return self.load_one_expert(moe, name, tensor)
        if names.fused:
            return self.load_fused(moe, name, tensor)
        return []

    def load_one_expert(self, moe: nn.Module, name: str, tensor) -> list[str]:
        expert, part = self.per_expert[name]
        local = expert - self.placement.first_expert
        if not 0 <= local < self.placement.num_local_experts:
            return []  # another rank's expert
        place, inter = self.placement, self.placement.intermediate_size
        if part == "down":
            check_shape(tensor, (self.hidden_size, inter), name)
            piece = read_part(tensor, 1, place.intermediate_start, place.intermediate_shard)
            copy_checked(moe.w2[local], piece, name)
        else:
            check_shape(tensor, (inter, self.hidden_size), name)
            piece = read_part(tensor, 0, place.intermediate_start, place.intermediate_shard)
            half = 0 if part == "gate" else 1
            rows = moe.w13[local].narrow(
                0, half * place.intermediate_shard, place.intermediate_shard
            )
            copy_checked(rows, piece, name)
        return [f"experts.{expert}.{part}"]

    def load_fused(self, moe: nn.Module, name: str, tensor) -> list[str]:
        names = self.names
        if name == names.fused_gate_up:
            self.copy_gate_up(moe.w13, self.fused_gate_up(tensor, name).transpose(1, 2), name)
            return self.slots("gate", "up")
        if name == names.fused_gate_up_bias and moe.w13_bias is not None:
            self.copy_gate_up(moe.w13_bias, self.fused_gate_up_bias(tensor, name), name)
            return self.slots("gate_bias", "up_bias")
        if name == names.fused_down:
            copy_checked(moe.w2, self.fused_down(tensor, name).transpose(1, 2), name)
            return self.slots("down")
        if name == names.fused_down_bias and moe.w2_bias is not None:
            check_shape(tensor, (self.placement.num_experts, self.hidden_size), name)
            copy_checked(moe.w2_bias, self.expert_rows(tensor), name)
            return self.slots("down_bias")
        for base in (names.fused_gate_up, names.fused_down):
            for suffix in MXFP4_PARTS:
                if name == base + suffix:
                    return self.load_mxfp4(moe, base, suffix, tensor)
        return []

    def expert_rows(self, tensor) -> torch.Tensor:
        place = self.placement
        return read_part(tensor, 0, place.first_expert, place.num_local_experts)

    def fused_gate_up(self, tensor, name: str) -> torch.Tensor:
        """``[E, H, 2I]`` → this rank's ``[E_local, H, 2 I_shard]`` (still interleaved)."""
        place = self.placement
        check_shape(
            tensor, (place.num_experts, self.hidden_size, 2 * place.intermediate_size), name
        )
        if place.is_partial:
            return self.expert_rows(tensor)
        return read_part(tensor, 2, 2 * place.intermediate_start, 2 * place.intermediate_shard)

    def fused_gate_up_bias(self, tensor, name: str) -> torch.Tensor:
        place = self.placement
        check_shape(tensor, (place.num_experts, 2 * place.intermediate_size), name)
        if place.is_partial:
            return self.expert_rows(tensor)
        return read_part(tensor, 1, 2 * place.intermediate_start, 2 * place.intermediate_shard)

    def fused_down(self, tensor, name: str) -> torch.Tensor:
        """``[E, I, H]`` → this rank's ``[E_local, I_shard, H]``."""
        place = self.placement
        check_shape(tensor, (place.num_experts, place.intermediate_size, self.hidden_size), name)
        if place.is_partial:
            return self.expert_rows(tensor)
        return read_part(tensor, 1, place.intermediate_start, place.intermediate_shard)

    def copy_gate_up(self, target: torch.Tensor, interleaved: torch.Tensor, name: str) -> None:
        """Gate/up interleaved on dim 1 (gate at even indices) → gate rows, then up rows."""
        shard = self.placement.intermediate_shard
        copy_checked(target.narrow(1, 0, shard), interleaved[:, 0::2], name)
        copy_checked(target.narrow(1, shard, shard), interleaved[:, 1::2], name)

    def load_mxfp4(self, moe: nn.Module, base: str, suffix: str, tensor) -> list[str]:
        pending = self.pending.setdefault(base, {})
        pending[suffix] = self.mxfp4_part(base, tensor)
        if len(pending) < len(MXFP4_PARTS):
            return []
        del self.pending[base]
        blocks, scales = pending["_blocks"], pending["_scales"]
        if moe.quantization == "mxfp4":  # kept 4-bit, per expert (mxfp4_experts.py)
            return load_kept_mxfp4(self, moe, base, blocks, scales)
        if base == self.names.fused_down:
            values = dequantize_mxfp4(blocks, scales, moe.w2.dtype)
            copy_checked(moe.w2, self.down_columns(values), base + "_blocks")
            return self.slots("down")
        values = dequantize_mxfp4(blocks, scales, moe.w13.dtype)  # [E_local, 2 I_shard, H]
        self.copy_gate_up(moe.w13, values, base + "_blocks")
        return self.slots("gate", "up")

    def mxfp4_part(self, base: str, tensor) -> torch.Tensor:
        """This rank's part of a blocks ``[E, rows, G, 16]`` or scales ``[E, rows, G]``
        tensor: its experts, its interleaved gate/up rows, or (down) its column groups
        where the slice falls on whole groups (else every group; cut after dequantizing)."""
        place = self.placement
        if place.is_partial:
            return self.expert_rows(tensor)
        if base == self.names.fused_gate_up:
            return read_part(tensor, 1, 2 * place.intermediate_start, 2 * place.intermediate_shard)
        if place.intermediate_start % BLOCK_VALUES or place.intermediate_shard % BLOCK_VALUES:
            return materialize(tensor)
        start, length = (
            place.intermediate_start // BLOCK_VALUES,
            place.intermediate_shard // BLOCK_VALUES,
        )
        return read_part(tensor, 2, start, length)

    def down_columns(self, values: torch.Tensor) -> torch.Tensor:
        """Dequantized down ``[E_local, H, I or I_shard]`` → this rank's columns."""
        place = self.placement
        if values.shape[2] == place.intermediate_shard:
            return values
        return values.narrow(2, place.intermediate_start, place.intermediate_shard)
