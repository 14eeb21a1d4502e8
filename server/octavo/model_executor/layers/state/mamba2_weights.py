"""Copying a Mamba2 mixer's checkpoint tensors (transformers' names, relative to the
mixer) into this tensor-parallel rank's shard of it.

* ``in_proj.weight`` / ``.bias``: ``z``, ``x``, ``B``, ``C``, ``dt`` rows stacked: each
  is one shard of the column-parallel ``in_proj``;
* ``conv1d.weight [channels, 1, kernel]`` / ``.bias``: the ``x``, ``B``, ``C`` channels,
  each cut to this rank's heads or groups;
* ``A_log``, ``D``, ``dt_bias`` (per head) and ``norm.weight`` (per channel): this rank's;
* ``out_proj``: row-parallel, as every output projection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from octavo.model_executor.checkpoint_slice import RowRange
from octavo.model_executor.layers.linear import copy_checked

if TYPE_CHECKING:
    from octavo.model_executor.layers.state.mamba2_mixer import Mamba2Mixer, Mamba2Spec

PER_HEAD = ("A_log", "D", "dt_bias")


class Mamba2Weights:
    def __init__(self, spec: Mamba2Spec, rank: int, ranks: int) -> None:
        self.spec = spec
        heads, group_width = spec.num_heads // ranks, spec.n_groups * spec.state_size // ranks
        inner = heads * spec.head_dim
        self.head_rows = (rank * heads, heads)
        self.inner_rows = (rank * inner, inner)
        whole = spec.intermediate_size
        b_start = whole + rank * group_width
        c_start = whole + spec.n_groups * spec.state_size + rank * group_width
        # this rank's conv channels: (first channel in the checkpoint, count) of x, B, C
        self.conv_rows = [self.inner_rows, (b_start, group_width), (c_start, group_width)]

    def expected_keys(self) -> set[str]:
        keys = {"in_proj.weight", "conv1d.weight", "norm.weight", "out_proj.weight", *PER_HEAD}
        if self.spec.proj_bias:
            keys |= {"in_proj.bias", "out_proj.bias"}
        if self.spec.conv_bias:
            keys.add("conv1d.bias")
        return keys

    def load(self, mixer: Mamba2Mixer, name: str, tensor) -> list[str]:
        """The ``expected_keys`` this tensor filled (none for a name the mixer lacks)."""
        module, _, kind = name.rpartition(".")
        if module == "in_proj":
            self.load_in_proj(mixer, kind, tensor, name)
        elif module == "conv1d":
            target = mixer.conv_weight if kind == "weight" else mixer.conv_bias
            copy_checked(target, self.conv_channels(tensor).reshape(target.shape), name)
        elif module == "out_proj":
            out_proj = mixer.out_proj
            target = out_proj.weight if kind == "weight" else out_proj.reduced_bias
            out_proj.weight_loader(target, tensor, name)
        elif name in PER_HEAD:
            copy_checked(getattr(mixer, name), tensor.narrow(0, *self.head_rows), name)
        elif name == "norm.weight":
            copy_checked(mixer.norm.weight, tensor.narrow(0, *self.inner_rows), name)
        else:
            return []
        return [name]

    def load_in_proj(self, mixer: Mamba2Mixer, kind: str, tensor, name: str) -> None:
        in_proj, start = mixer.in_proj, 0
        for shard_id, rows in enumerate(in_proj.total_output_sizes):
            part = RowRange(tensor, start, rows)
            in_proj.weight_loader(getattr(in_proj, kind), part, f"{name}[{shard_id}]", shard_id)
            start += rows

    def conv_channels(self, tensor) -> torch.Tensor:
        """This rank's x, B and C channels of a conv weight or bias, in that order."""
        return torch.cat([tensor.narrow(0, start, count) for start, count in self.conv_rows])
