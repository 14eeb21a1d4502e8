"""LFM2's short-convolution mixer: a state layer in attention's place.

As transformers' ``Lfm2ShortConv``: ``in_proj`` yields three gates ``B, C, x`` per
channel; ``B * x`` runs through a causal depthwise convolution of ``conv_L_cache`` taps
(no activation); ``C`` gates its output; ``out_proj`` maps it back. The state a sequence
keeps is the convolution's last ``kernel - 1`` inputs per channel.

Under tensor parallelism the channels are split: ``in_proj`` is column-parallel (each rank
takes the same channel range of B, C and x), the convolution keeps that range's taps and
``out_proj`` is row-parallel over it.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.attention.metadata import AttentionMetadata
from octavo.distributed.parallel_state import tensor_parallel_group
from octavo.kv_cache.state_slots import StateSpec
from octavo.model_executor.checkpoint_slice import RowRange, materialize
from octavo.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
    copy_checked,
)
from octavo.model_executor.layers.state.causal_conv1d import causal_conv1d


class ShortConv(nn.Module):
    def __init__(self, hidden_size: int, kernel_size: int, bias: bool, method) -> None:
        super().__init__()
        self.hidden_size, self.kernel_size = hidden_size, kernel_size
        self.in_proj = MergedColumnParallelLinear(
            hidden_size, [hidden_size] * 3, bias=bias, method=method()
        )
        self.out_proj = RowParallelLinear(hidden_size, hidden_size, bias=bias, method=method())
        start, end = tensor_parallel_group().shard(hidden_size, "convolution channels")
        self.channel_start, self.channels = start, end - start
        self.conv_weight = nn.Parameter(
            torch.empty(self.channels, kernel_size), requires_grad=False
        )
        self.conv_bias = None
        if bias:
            self.conv_bias = nn.Parameter(torch.empty(self.channels), requires_grad=False)

    def state_spec(self) -> StateSpec:
        """The convolution's last ``kernel - 1`` inputs of this rank's channels."""
        return StateSpec(((self.channels, self.kernel_size - 1),))

    def forward(
        self, hidden: torch.Tensor, state: tuple[torch.Tensor, ...], meta: AttentionMetadata
    ) -> torch.Tensor:
        gate_b, gate_c, x = self.in_proj(hidden).split(self.channels, dim=-1)
        convolved = causal_conv1d(gate_b * x, self.conv_weight, self.conv_bias, state[0], meta)
        return self.out_proj(gate_c * convolved)

    # --- checkpoint: transformers' names under the mixer ----------------------------------

    def expected_keys(self) -> set[str]:
        keys = {"in_proj.weight", "out_proj.weight", "conv.weight"}
        if self.conv_bias is not None:
            keys |= {"in_proj.bias", "out_proj.bias", "conv.bias"}
        return keys

    def load_checkpoint_tensor(self, name: str, tensor) -> list[str]:
        """This rank's part of ``in_proj`` (B, C, x stored as one matrix), ``conv``
        (``[channels, 1, kernel]``) or ``out_proj``; the keys it filled."""
        module, _, kind = name.rpartition(".")
        if module == "in_proj":
            self._load_in_proj(kind, tensor)
        elif module == "conv":
            self._load_conv(kind, tensor)
        elif module == "out_proj":
            target = self.out_proj.weight if kind == "weight" else self.out_proj.reduced_bias
            self.out_proj.weight_loader(target, tensor, name)
        else:
            return []
        return [name]

    def _load_in_proj(self, kind: str, tensor) -> None:
        target = getattr(self.in_proj, kind)
        for shard_id in range(3):
            part = RowRange(tensor, shard_id * self.hidden_size, self.hidden_size)
            self.in_proj.weight_loader(target, part, f"in_proj.{kind}[{shard_id}]", shard_id)

    def _load_conv(self, kind: str, tensor) -> None:
        rows = materialize(RowRange(tensor, self.channel_start, self.channels))
        target = self.conv_weight if kind == "weight" else self.conv_bias
        copy_checked(target, rows.reshape(target.shape), f"conv.{kind}")
