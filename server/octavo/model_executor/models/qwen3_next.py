"""Qwen3-Next: a hybrid of gated DeltaNet linear attention and gated full attention, with
Qwen 3 MoE's experts beside a gated shared expert, as transformers' ``modeling_qwen3_next``.

* ``layer_types`` names each layer's mixer: ``linear_attention`` layers are state layers
  (``layers/state/gated_delta_net``: a conv window and a delta-rule matrix per sequence,
  no KV blocks); ``full_attention`` layers attend over the paged KV cache with
  ``layers/gated_attention`` (a sigmoid output gate from ``q_proj``, per-head Q/K norms,
  rope on the first ``partial_rotary_factor`` of each head);
* every norm is zero-centred (weight applied as ``1 + w``, in float32: Gemma's);
* the MoE layers (Qwen 3 MoE's rule: ``decoder_sparse_step``, ``mlp_only_layers``) add a
  shared expert whose output is scaled by ``sigmoid(shared_expert_gate(x))``.

Checkpoint names: ``linear_attn.*`` is the layer's mixer (``self_attn`` here) and
``mlp.shared_expert.*`` the shared expert (``shared_experts`` as DeepSeek names it); the
multi-token-prediction layers (``mtp.*``) are not used.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import torch
from torch import nn

from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.gated_attention import GatedAttention
from octavo.model_executor.layers.mla_attention import ReplicatedLinear
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.moe import FusedMoE
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.layers.state.gated_delta_net import GatedDeltaNet, GatedDeltaNetSpec
from octavo.model_executor.models.layer_spec import LayerSpec
from octavo.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM
from octavo.model_executor.models.shared_experts import MoEWithSharedExperts

SHARED_EXPERT_GATE = "shared_expert_gate.weight"


class Qwen3NextForCausalLM(Qwen3MoeForCausalLM):
    architectures = ("Qwen3NextForCausalLM",)
    norm_kind = "gemma"  # (1 + w), as Qwen3NextRMSNorm
    state_layer_types: ClassVar[frozenset[str]] = frozenset({"linear_attention"})

    def layer_spec(self, index: int) -> LayerSpec:
        spec = super().layer_spec(index)
        if self.is_state_layer(index):
            return spec
        return dataclasses.replace(
            spec, attention_block=functools.partial(self.make_attention, index)
        )

    def make_attention(self, index: int) -> nn.Module:
        method = functools.partial(linear_method_for, self.quantization)
        config = self.config
        spec = self.attention_spec(index)
        return GatedAttention(config.hidden_size, spec, self.norm_kind, config.rms_norm_eps, method)

    def make_state_mixer(self, index: int) -> nn.Module:
        hf = self.config.hf
        spec = GatedDeltaNetSpec(
            num_k_heads=hf.linear_num_key_heads,
            num_v_heads=hf.linear_num_value_heads,
            head_k_dim=hf.linear_key_head_dim,
            head_v_dim=hf.linear_value_head_dim,
            conv_kernel=hf.linear_conv_kernel_dim,
            norm_eps=self.config.rms_norm_eps,
        )
        method = functools.partial(linear_method_for, self.quantization)
        return GatedDeltaNet(self.config.hidden_size, spec, method)

    def make_mlp(self, index: int) -> nn.Module:
        routed = super().make_mlp(index)
        if not self.is_sparse(index):
            return routed
        method = functools.partial(linear_method_for, self.quantization)
        size = self.config.hf.shared_expert_intermediate_size
        shared = GatedMLP(self.config.hidden_size, size, SiluAndMul(), method)
        return MoEWithGatedSharedExpert(routed, shared, self.config.hidden_size)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        if name.startswith("mtp."):
            return None
        name = name.replace(".linear_attn.", ".self_attn.")
        return name.replace(".mlp.shared_expert.", ".mlp.shared_experts.")


class MoEWithGatedSharedExpert(MoEWithSharedExperts):
    """Routed experts plus ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``; the gate
    (one output) is whole on every rank."""

    def __init__(self, routed: FusedMoE, shared: GatedMLP, hidden_size: int) -> None:
        super().__init__(routed, shared)
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, False, None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.shared_expert_gate(hidden))
        return self.routed(hidden) + gate * self.shared_experts(hidden)

    def load_checkpoint_tensor(self, name: str, tensor) -> list[str]:
        if name != SHARED_EXPERT_GATE:
            return super().load_checkpoint_tensor(name, tensor)
        linear = self.shared_expert_gate
        linear.weight_loader(linear.weight, tensor, name)
        return [name]

    def expected_keys(self) -> set[str]:
        return super().expected_keys() | {SHARED_EXPERT_GATE}
