"""``FusedMoE``: a mixture-of-experts MLP (router + experts stacked in two tensors).

Experts are stored stacked: ``w13 [E_local, 2 I_shard, H]`` (each expert's gate rows,
then its up rows) and ``w2 [E_local, H, I_shard]``, with optional biases (gpt-oss). The
forward routes each token to its top-k experts (``router.py``), runs them — on CPU grouped
by expert (``grouped.py``), on CUDA through the Triton fused-MoE kernel — and sums the
ranks' partial outputs with the tensor-parallel all-reduce (``placement.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import tensor_parallel_group
from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.moe.checkpoint import ExpertCheckpoint
from octavo.model_executor.layers.moe.group_limited import PLAIN_SELECTION, Selection
from octavo.model_executor.layers.moe.grouped import grouped_experts
from octavo.model_executor.layers.moe.names import ExpertNames
from octavo.model_executor.layers.moe.placement import ExpertPlacement
from octavo.model_executor.layers.moe.quantized_experts import (
    CHECKPOINT_EXPERT_METHODS,
    CheckpointExperts,
    QuantizedExperts,
    check_expert_quantization,
    expert_quantization,
)
from octavo.model_executor.layers.moe.router import TopKRouter


class FusedMoE(nn.Module):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        names: ExpertNames,
        router: str = "softmax",
        renormalize: bool = True,
        activation: nn.Module | None = None,
        bias: bool = False,
        router_bias: bool = False,
        quantization: str | None = None,
        enable_expert_parallel: bool = False,
        router_weights_in_model_dtype: bool = False,
        selection: Selection = PLAIN_SELECTION,
    ) -> None:
        super().__init__()
        quantization = expert_quantization(quantization)
        check_expert_quantization(quantization)
        if router_bias and names.router_bias is None:
            raise ValueError("router_bias=True needs ExpertNames.router_bias")
        if selection.correction_bias and names.router_score_bias is None:
            raise ValueError("a correction bias needs ExpertNames.router_score_bias")
        self.tp = tensor_parallel_group()
        self.placement = ExpertPlacement.for_rank(
            self.tp, num_experts, intermediate_size, enable_expert_parallel
        )
        self.hidden_size, self.quantization = hidden_size, quantization
        self.activation = activation if activation is not None else SiluAndMul()
        self.router = TopKRouter(
            num_experts,
            top_k,
            hidden_size,
            kind=router,
            renormalize=renormalize,
            bias=router_bias,
            weights_in_model_dtype=router_weights_in_model_dtype,
            selection=selection,
        )
        self.create_weights(bias)
        self.register_buffer("expert_map", self.placement.expert_map(), persistent=False)
        self.checkpoint = ExpertCheckpoint(names, self.placement, hidden_size)
        self.has_bias = bias

    def create_weights(self, bias: bool) -> None:
        experts = self.placement.num_local_experts
        inter, hidden = self.placement.intermediate_shard, self.hidden_size

        def parameter(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape), requires_grad=False)

        self.quantized = None  # int8 / fp8: made from the float stacks once loaded
        if self.quantization in CHECKPOINT_EXPERT_METHODS:  # kept as stored, no float stacks
            self.quantized = CheckpointExperts(experts, inter, hidden)
            self.w13, self.w2 = self.quantized.weight_slots()
        else:
            self.w13 = parameter(experts, 2 * inter, hidden)
            self.w2 = parameter(experts, hidden, inter)
        self.w13_bias = parameter(experts, 2 * inter) if bias else None
        self.w2_bias = parameter(experts, hidden) if bias else None

    def load_checkpoint_tensor(self, name: str, tensor) -> list[str]:
        """Copy this rank's part of checkpoint tensor ``name`` (relative to the MoE block);
        returns the ``expected_keys`` it filled (none for a name it does not know)."""
        return self.checkpoint.load(self, name, tensor)

    def expected_keys(self) -> set[str]:
        keys = self.checkpoint.expected_keys(self.has_bias, self.router.bias is not None)
        if self.router.e_score_correction_bias is not None:
            keys.add(self.checkpoint.names.router_score_bias)
        return keys

    def process_weights_after_loading(self) -> None:
        # Built on the meta device, the map's buffer holds no values after ``to_empty``.
        expert_map = self.placement.expert_map()
        device = self.router.weight.device
        self.expert_map = None if expert_map is None else expert_map.to(device)
        if isinstance(self.quantized, CheckpointExperts):
            self.quantized.process_weights_after_loading()
            self.w13 = self.w2 = None  # the slots' segments hold the weights now
            return
        if self.quantization is None or self.quantized is not None:
            return
        self.quantized = QuantizedExperts(self.w13, self.w2, self.quantization)
        self.w13 = self.w2 = None  # the quantized copies replace them

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [T, H]`` → ``[T, H]``."""
        topk_weights, topk_ids = self.router(hidden)
        return self.tp.all_reduce(self.experts(hidden, topk_weights, topk_ids))

    def experts(
        self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """This rank's share of the experts' weighted outputs (before the all-reduce)."""
        if hidden.is_cuda and self.quantized is None:
            return self.experts_triton(hidden, topk_weights, topk_ids)
        return grouped_experts(
            hidden,
            topk_weights,
            topk_ids,
            self.placement.num_local_experts,
            self.run_expert,
            self.expert_map,
        )

    def run_expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """One local expert on its rows: ``down(act(gate_up(rows)))``, biases included."""
        gate_up_bias = None if self.w13_bias is None else self.w13_bias[expert]
        down_bias = self.down_bias()
        down_bias = None if down_bias is None else down_bias[expert]
        if self.quantized is None:
            gate_up = F.linear(rows, self.w13[expert], gate_up_bias)
            return F.linear(self.activation(gate_up), self.w2[expert], down_bias)
        gate_up = self.quantized.gate_up[expert](rows)
        if gate_up_bias is not None:
            gate_up = gate_up + gate_up_bias
        out = self.quantized.down[expert](self.activation(gate_up))
        return out if down_bias is None else out + down_bias

    def down_bias(self) -> torch.Tensor | None:
        """The down bias where this rank adds it (once over the tensor-parallel ranks)."""
        return self.w2_bias if self.placement.adds_down_bias else None

    def experts_triton(self, hidden, topk_weights, topk_ids) -> torch.Tensor:
        from octavo.model_executor.layers.moe.triton_fused_moe import (
            SwigluConstants,
            fused_moe_triton,
        )

        alpha, limit = (getattr(self.activation, name, None) for name in ("alpha", "limit"))
        swiglu = None if alpha is None else SwigluConstants(alpha=alpha, limit=limit)
        return fused_moe_triton(
            hidden,
            self.w13,
            self.w2,
            topk_weights,
            topk_ids,
            activation=activation_name(self.activation),
            w13_bias=self.w13_bias,
            w2_bias=self.down_bias(),
            expert_map=self.expert_map,
            swiglu=swiglu,  # the config's swiglu_alpha / swiglu_limit, as on the CPU path
        )


def activation_name(activation: nn.Module) -> str:
    """The Triton kernel's name for an activation module."""
    names = {"SiluAndMul": "silu", "ClampedSwigluAndMul": "clamped_swiglu"}
    kind = type(activation).__name__
    if kind not in names:
        raise ValueError(f"the fused-MoE kernel has no activation {kind}")
    return names[kind]
