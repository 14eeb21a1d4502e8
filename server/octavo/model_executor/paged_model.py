"""A model with its paged KV cache: what a forward pass needs besides the step itself."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.attention.backend import AttentionBackend
from octavo.distributed.pipeline_comm import IntermediateTensors
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.step_inputs import StepInputs


@dataclass
class PagedModel:
    model: CausalLM
    kv_caches: list[torch.Tensor]  # one per layer of this rank's stage
    block_size: int
    attention: AttentionBackend
    device: torch.device
    # KV cache groups: each layer's group (its block table); None for one group
    layer_groups: list[int] | None = None

    @property
    def activation_dtype(self) -> torch.dtype:
        """The hidden states' dtype (the KV cache's may differ: fp8)."""
        assert self.model.rotary, "the loader sets the rotary tables"
        return next(iter(self.model.rotary.values())).cos.dtype

    def forward(self, inputs: StepInputs, intermediate: IntermediateTensors | None = None):
        """Logits of the step's ``logits_indices`` rows (or the activations for the next
        pipeline stage)."""
        return self.model(
            inputs.input_ids,
            inputs.positions,
            self.kv_caches,
            inputs.meta,
            self.attention,
            inputs.logits_indices,
            intermediate,
        )

    def run(self, inputs: StepInputs, intermediate: IntermediateTensors | None = None):
        """``forward``'s logits with the pooled rows' final hidden states (``StepResult``),
        or the activations for the next pipeline stage."""
        extra = {} if inputs.token_type_ids is None else {"token_type_ids": inputs.token_type_ids}
        return self.model.run(
            inputs.input_ids,
            inputs.positions,
            self.kv_caches,
            inputs.meta,
            self.attention,
            inputs.logits_indices,
            inputs.pooled_indices,
            intermediate,
            inputs.image_embeds,
            **extra,
        )
