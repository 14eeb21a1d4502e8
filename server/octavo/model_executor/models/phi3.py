"""Phi-3 and Phi-4 (``Phi3ForCausalLM``): the Llama decoder with Q/K/V and gate/up stored
fused in the checkpoint (``qkv_proj``, ``gate_up_proj``; the loader splits them), a
sliding window over every layer where the config names one (Phi-3-mini-4k), and LongRoPE
or default rope with ``partial_rotary_factor`` (Phi-4-mini rotates 3/4 of each head),
all read by the shared config and rope code.

PEFT adapters for Phi-3 target the fused modules too: ``lora_fused_modules`` names the
pieces each holds, in row order, and the adapter reader splits their ``lora_B`` rows.
"""

from __future__ import annotations

from typing import ClassVar

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.models.causal_lm import CausalLM


class Phi3ForCausalLM(CausalLM):
    architectures = ("Phi3ForCausalLM",)
    gguf_layout = GgufLayout("phi3", tensor_choices={"ffn_up": "mlp.gate_up_proj"})
    stored_fused_modules: ClassVar[dict[str, str]] = {
        "self_attn.qkv_proj": "self_attn.qkv",
        "mlp.gate_up_proj": "mlp.gate_up",
    }
    # PEFT's name of a fused module -> the modules whose rows it stacks, in order.
    lora_fused_modules: ClassVar[dict[str, tuple[str, ...]]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }
