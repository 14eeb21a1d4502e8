"""Which part of a Mamba2 mixer one tensor-parallel rank holds, and copying the checkpoint's
tensors (transformers' names, relative to the mixer) into it.

Heads (with their ``z``, ``x``, ``dt``, ``A_log``, ``D``, ``dt_bias``) are split evenly
over the ranks. ``B``/``C`` groups too when ``n_groups`` divides by the ranks; with
fewer groups than ranks (one group, as the released Granite 4.0 models) each rank keeps
the group its heads read, and the gated norm's groups then span ranks.

* ``in_proj.weight`` / ``.bias``: ``z``, ``x``, ``B``, ``C``, ``dt`` rows stacked;
* ``conv1d.weight [channels, 1, kernel]`` / ``.bias``: the ``x``, ``B``, ``C`` channels;
* ``A_log``, ``D``, ``dt_bias`` (per head) and ``norm.weight`` (per ``x`` channel);
* ``out_proj``: row-parallel, as every output projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from octavo.model_executor.layers.linear import copy_checked

if TYPE_CHECKING:
    from octavo.model_executor.layers.state.mamba2_mixer import Mamba2Mixer, Mamba2Spec

PER_HEAD = ("A_log", "D", "dt_bias")
Rows = tuple[int, int]  # (first row in the checkpoint tensor, count)


@dataclass(frozen=True)
class Mamba2Shard:
    spec: Mamba2Spec
    heads: int  # this rank's
    groups: int  # this rank's (the one its heads read when groups are replicated)
    first_head: int
    first_group: int
    norm_spans_ranks: bool  # a norm group is split over every rank (one group)

    @classmethod
    def of(cls, spec: Mamba2Spec, rank: int, ranks: int) -> Mamba2Shard:
        if spec.num_heads % ranks or (spec.n_groups % ranks and spec.n_groups != 1):
            raise ValueError(
                f"Mamba2: {spec.num_heads} heads in {spec.n_groups} groups cannot be split "
                f"over {ranks} tensor-parallel ranks (heads must divide, and groups divide "
                "or be one)"
            )
        heads = spec.num_heads // ranks
        groups = max(1, spec.n_groups // ranks)
        first_group = rank * groups if spec.n_groups >= ranks else 0
        spans = spec.n_groups < ranks
        return cls(spec, heads, groups, rank * heads, first_group, spans)

    @property
    def inner(self) -> int:  # this rank's x (and z) channels
        return self.heads * self.spec.head_dim

    @property
    def group_width(self) -> int:  # this rank's B (and C) channels
        return self.groups * self.spec.state_size

    def head_rows(self, width: int, offset: int = 0) -> Rows:
        return offset + self.first_head * width, self.heads * width

    def group_rows(self, offset: int) -> Rows:
        size = self.spec.state_size
        return offset + self.first_group * size, self.groups * size

    def conv_rows(self) -> list[Rows]:
        """x, B, C of the conv's channels (the in_proj's rows after ``z``)."""
        spec = self.spec
        whole, groups = spec.intermediate_size, spec.n_groups * spec.state_size
        x = self.head_rows(spec.head_dim)
        return [x, self.group_rows(whole), self.group_rows(whole + groups)]

    def in_proj_rows(self) -> list[Rows]:
        """z, x, B, C, dt of the in_proj's rows."""
        spec = self.spec
        whole = spec.intermediate_size
        after_conv = whole + spec.conv_channels
        xbc = [(start + whole, count) for start, count in self.conv_rows()]
        return [self.head_rows(spec.head_dim), *xbc, self.head_rows(1, after_conv)]


def expected_keys(spec: Mamba2Spec) -> set[str]:
    keys = {"in_proj.weight", "conv1d.weight", "norm.weight", "out_proj.weight", *PER_HEAD}
    if spec.proj_bias:
        keys |= {"in_proj.bias", "out_proj.bias"}
    if spec.conv_bias:
        keys.add("conv1d.bias")
    return keys


def load_mamba2_tensor(mixer: Mamba2Mixer, name: str, tensor) -> list[str]:
    """The ``expected_keys`` this checkpoint tensor filled (none for a name it lacks)."""
    shard, (module, _, kind) = mixer.shard, name.rpartition(".")
    if module == "in_proj":
        copy_checked(getattr(mixer.in_proj, kind), _rows(tensor, shard.in_proj_rows()), name)
    elif module == "conv1d":
        target = mixer.conv_weight if kind == "weight" else mixer.conv_bias
        copy_checked(target, _rows(tensor, shard.conv_rows()).reshape(target.shape), name)
    elif module == "out_proj":
        out_proj = mixer.out_proj
        target = out_proj.weight if kind == "weight" else out_proj.reduced_bias
        out_proj.weight_loader(target, tensor, name)
    elif name in PER_HEAD:
        copy_checked(getattr(mixer, name), tensor.narrow(0, *shard.head_rows(1)), name)
    elif name == "norm.weight":
        rows = shard.head_rows(shard.spec.head_dim)
        copy_checked(mixer.norm.weight, tensor.narrow(0, *rows), name)
    else:
        return []
    return [name]


def _rows(tensor, rows: list[Rows]) -> torch.Tensor:
    """The given row ranges of a checkpoint tensor, one after another."""
    return torch.cat([tensor.narrow(0, start, count) for start, count in rows])
