"""The mixture-of-experts feed-forward block of a MoE architecture, built from the model's
settings: its quantization (``--quantization`` covers the experts) and whether experts
are placed whole per tensor rank (``--enable-expert-parallel``)."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.model_executor.layers.activation import activation_for
from octavo.model_executor.layers.moe import ExpertNames, FusedMoE
from octavo.model_executor.layers.moe.group_limited import PLAIN_SELECTION, Selection
from octavo.model_executor.models.causal_lm import CausalLM


@dataclass(frozen=True)
class MoEShape:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    renormalize: bool  # top-k weights rescaled to sum to 1
    weights_in_model_dtype: bool  # routing weights cast to the model's dtype (Qwen)
    router: str = "softmax"  # the router's kind (``TopKRouter``): "sigmoid" for DeepSeek-V3
    selection: Selection = PLAIN_SELECTION  # DeepSeek's groups, correction bias, scaling


def expert_mlp(model: CausalLM, names: ExpertNames, shape: MoEShape) -> FusedMoE:
    config = model.config
    return FusedMoE(
        shape.num_experts,
        shape.top_k,
        config.hidden_size,
        shape.intermediate_size,
        names=names,
        renormalize=shape.renormalize,
        activation=activation_for(getattr(config.hf, "hidden_act", "silu")),
        quantization=model.quantization,
        enable_expert_parallel=config.enable_expert_parallel,
        router_weights_in_model_dtype=shape.weights_in_model_dtype,
        router=shape.router,
        selection=shape.selection,
    )
