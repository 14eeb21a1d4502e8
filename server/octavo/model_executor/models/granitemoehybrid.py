"""IBM Granite 4.0 hybrid (``GraniteMoeHybridForCausalLM``), as transformers'
``modeling_granitemoehybrid``: Granite's four multipliers (``granite.py``) on a decoder
whose ``layer_types`` mix

* ``mamba`` layers (transformers reads them as ``linear_attention``): a Mamba2 mixer
  (``layers/state/mamba2_mixer``), a state layer keeping a conv and an SSM state per
  sequence (``model.layers.N.mamba.*`` in the checkpoint);
* ``attention`` layers: grouped-query attention scaled by ``attention_multiplier``, with
  rope only when ``position_embedding_type`` is ``"rope"`` (the released models use none);

and, in every layer, a shared gated MLP of ``shared_intermediate_size`` plus, when
``num_local_experts`` is not 0, routed experts (top-k logits softmaxed) added to it
(``granite_moe``).
"""

from __future__ import annotations

import dataclasses
import functools

from torch import nn

from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.layers.state.mamba2_mixer import Mamba2Mixer, Mamba2Spec
from octavo.model_executor.models.granite import GraniteForCausalLM
from octavo.model_executor.models.granite_moe import GRANITE_MOE, ROUTED, SHARED, GraniteMoE
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.models.moe_mlp import MoEShape, expert_mlp

NO_TIME_STEP_LIMIT = (0.0, float("inf"))


class GraniteMoeHybridForCausalLM(GraniteForCausalLM):
    architectures = ("GraniteMoeHybridForCausalLM",)
    state_layer_types = frozenset({"linear_attention", "mamba"})

    def attention_spec(self, index: int) -> AttentionSpec:
        spec = super().attention_spec(index)
        if getattr(self.config.hf, "position_embedding_type", None) == "rope":
            return spec
        return dataclasses.replace(spec, rope=None)  # NoPE

    def make_state_mixer(self, index: int) -> nn.Module:
        # unquantized: the mixer loads its own tensors (``mamba2_weights``), weights only
        return Mamba2Mixer(self.mamba_spec(), functools.partial(linear_method_for, None))

    def mamba_spec(self) -> Mamba2Spec:
        hf = self.config.hf
        return Mamba2Spec(
            hidden_size=self.config.hidden_size,
            num_heads=hf.mamba_n_heads,
            head_dim=hf.mamba_d_head,
            state_size=hf.mamba_d_state,
            n_groups=hf.mamba_n_groups,
            conv_kernel=hf.mamba_d_conv,
            chunk_size=hf.mamba_chunk_size,
            norm_eps=self.config.rms_norm_eps,
            conv_bias=bool(hf.mamba_conv_bias),
            proj_bias=bool(hf.mamba_proj_bias),
            activation=hf.hidden_act,
            time_step_limit=tuple(hf.time_step_limit or NO_TIME_STEP_LIMIT),
        )

    def make_mlp(self, index: int) -> nn.Module:
        hf, method = self.config.hf, functools.partial(linear_method_for, self.quantization)
        shared = GatedMLP(
            self.config.hidden_size, hf.shared_intermediate_size, SiluAndMul(), method
        )
        if not hf.num_local_experts:
            return GraniteMoE(shared, None)
        shape = MoEShape(
            num_experts=hf.num_local_experts,
            top_k=hf.num_experts_per_tok,
            intermediate_size=self.config.intermediate_size,
            renormalize=False,
            weights_in_model_dtype=True,
            router="softmax_after_topk",
        )
        return GraniteMoE(shared, expert_mlp(self, GRANITE_MOE, shape))

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        """The mixer sits where attention does; both feed-forward parts under ``mlp.``."""
        for part in (ROUTED, SHARED):
            name = name.replace(f".{part}", f".mlp.{part}")
        return name.replace(".mamba.", ".self_attn.")
