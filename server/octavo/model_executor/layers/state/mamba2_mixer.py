"""The Mamba2 mixer: a state layer (``kv_cache/state_slots.py``) that sits where a decoder
layer's attention would, as transformers' ``Mamba2Mixer`` / ``GraniteMoeHybridMambaLayer``.

``in_proj`` gives, per token, the gate ``z``, the scan's input ``x`` with its ``B`` and
``C`` (through a causal depthwise convolution and SiLU: ``causal_conv1d``) and the time
step ``dt`` of each head; the selective scan (``mamba2_ssd``) runs with ``A = -exp(A_log)``
and the ``D`` skip; the gated RMSNorm and ``out_proj`` finish. Each sequence keeps two
state tensors in its slot: the convolution's last ``kernel - 1`` inputs and the scan's
state ``[heads, head_dim, state_size]``.

Tensor parallelism splits heads (with their ``x``, ``z``, ``dt``) and groups (with their
``B``, ``C``) over the ranks, or replicates a single group (``mamba2_weights``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from octavo.attention.metadata import AttentionMetadata
from octavo.distributed.parallel_state import tensor_parallel_group
from octavo.kv_cache.state_slots import StateSpec
from octavo.model_executor.layers.linear import LinearBase, RowParallelLinear
from octavo.model_executor.layers.state.causal_conv1d import causal_conv1d
from octavo.model_executor.layers.state.mamba2_norm import Mamba2GatedNorm
from octavo.model_executor.layers.state.mamba2_ssd import (
    ScanInputs,
    discretize_dt,
    ssd_decode,
    ssd_prefill,
)
from octavo.model_executor.layers.state.mamba2_weights import (
    Mamba2Shard,
    expected_keys,
    load_mamba2_tensor,
)


@dataclass(frozen=True)
class Mamba2Spec:
    hidden_size: int
    num_heads: int
    head_dim: int
    state_size: int  # d_state: N
    n_groups: int
    conv_kernel: int  # d_conv
    chunk_size: int  # the SSD form's block of tokens
    norm_eps: float
    conv_bias: bool = True
    proj_bias: bool = False
    activation: str = "silu"  # the convolution's
    time_step_limit: tuple[float, float] = (0.0, float("inf"))

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:  # x, B and C go through the convolution
        return self.intermediate_size + 2 * self.n_groups * self.state_size


class Mamba2Mixer(nn.Module):
    def __init__(self, spec: Mamba2Spec, method) -> None:
        super().__init__()
        tp = tensor_parallel_group()
        self.spec, self.shard = spec, Mamba2Shard.of(spec, tp.rank, tp.size)
        self.heads, self.groups = self.shard.heads, self.shard.groups
        self.inner, group_width = self.shard.inner, self.shard.group_width
        channels = self.inner + 2 * group_width
        self.proj_splits = [self.inner, channels, self.heads]  # z, x B C, dt
        self.conv_splits = [self.inner, group_width, group_width]  # x, B, C
        # this rank's rows of every part (mamba2_weights picks them from the checkpoint)
        self.in_proj = LinearBase(
            spec.hidden_size, self.inner + channels + self.heads, spec.proj_bias, method()
        )

        def parameter(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape), requires_grad=False)

        self.conv_weight = parameter(channels, spec.conv_kernel)
        self.conv_bias = parameter(channels) if spec.conv_bias else None
        self.A_log, self.D, self.dt_bias = (parameter(self.heads) for _ in range(3))
        group_size = spec.intermediate_size // spec.n_groups
        spans = tp if self.shard.norm_spans_ranks else None
        self.norm = Mamba2GatedNorm(self.inner, group_size, spec.norm_eps, spans)
        self.out_proj = RowParallelLinear(
            spec.intermediate_size, spec.hidden_size, bias=spec.proj_bias, method=method()
        )

    def state_spec(self) -> StateSpec:
        conv = (self.conv_weight.shape[0], self.spec.conv_kernel - 1)
        return StateSpec(shapes=(conv, (self.heads, self.spec.head_dim, self.spec.state_size)))

    def forward(
        self, hidden: torch.Tensor, state: tuple[torch.Tensor, ...], meta: AttentionMetadata
    ) -> torch.Tensor:
        """``hidden [tokens, hidden_size]`` → ``[tokens, hidden_size]``; the rows
        ``meta.state_slots`` of ``state`` (conv, ssm) are read and updated in place."""
        conv_state, ssm_state = state
        gate, xbc, dt = self.in_proj(hidden).split(self.proj_splits, dim=-1)
        xbc = causal_conv1d(
            xbc, self.conv_weight, self.conv_bias, conv_state, meta, self.spec.activation
        )
        x, B, C = xbc.split(self.conv_splits, dim=-1)
        inputs = ScanInputs(
            x=x.reshape(-1, self.heads, self.spec.head_dim),
            dt=discretize_dt(dt, self.dt_bias, self.spec.time_step_limit),
            A=-torch.exp(self.A_log.float()),
            B=B.reshape(-1, self.groups, self.spec.state_size),
            C=C.reshape(-1, self.groups, self.spec.state_size),
        )
        y = self.scan(inputs, ssm_state, meta)
        y = y + inputs.x.float() * self.D.float()[:, None]
        return self.out_proj(self.norm(y.reshape(-1, self.inner), gate))

    def scan(
        self, inputs: ScanInputs, ssm_state: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The selective scan of every sequence of the step, from its slot's state (zeros
        where it starts fresh); the slots get the states after the step's tokens."""
        slots = meta.state_slots
        states = ssm_state.index_select(0, slots).float()
        if meta.state_has_initial is not None:
            states = states * meta.state_has_initial.view(-1, 1, 1, 1).float()
        y = inputs.x.new_empty(inputs.x.shape, dtype=torch.float32)
        for i in range(meta.num_prefills):
            start = meta.query_start_loc_list[i]
            rows = slice(start, start + meta.query_lens_list[i])
            y[rows], states[i] = ssd_prefill(_rows(inputs, rows), states[i], self.spec.chunk_size)
        if meta.num_decodes:
            rows, seqs = slice(meta.num_prefill_tokens, None), slice(meta.num_prefills, None)
            y[rows], states[seqs] = ssd_decode(_rows(inputs, rows), states[seqs])
        ssm_state.index_copy_(0, slots, states.to(ssm_state.dtype))
        return y

    def load_checkpoint_tensor(self, name: str, tensor) -> list[str]:
        """Copy this rank's part of a checkpoint tensor (name relative to the mixer)."""
        return load_mamba2_tensor(self, name, tensor)

    def expected_keys(self) -> set[str]:
        return expected_keys(self.spec)


def _rows(inputs: ScanInputs, rows: slice) -> ScanInputs:
    return ScanInputs(inputs.x[rows], inputs.dt[rows], inputs.A, inputs.B[rows], inputs.C[rows])
