"""LFM2 (``Lfm2ForCausalLM``): a hybrid of short-convolution and attention layers, as
transformers' ``modeling_lfm2``.

* ``layer_types`` names each layer ``conv`` (a state layer: ``layers/state/short_conv``,
  one state slot per sequence holding the convolution's last ``conv_L_cache - 1``
  inputs) or ``full_attention`` (attention with an RMSNorm over each head's query and key
  before rope, no biases);
* pre-norm layers (``operator_norm`` before the mixer, ``ffn_norm`` before the MLP), a
  final ``embedding_norm``; every norm takes ``norm_eps``;
* the SwiGLU MLP (``w1`` gate, ``w3`` up, ``w2`` down) is sized by
  ``block_auto_adjust_ff_dim``: two thirds of ``intermediate_size``, times
  ``block_ffn_dim_multiplier`` rounded up to ``block_multiple_of`` when one is set.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from torch import nn

from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.layers.state.short_conv import ShortConv
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec

_RENAMES = (  # transformers' names -> Llama's, which the shared blocks carry
    (re.compile(r"\.operator_norm\."), ".input_layernorm."),
    (re.compile(r"\.ffn_norm\."), ".post_attention_layernorm."),
    (re.compile(r"\.feed_forward\.w1\."), ".mlp.gate_proj."),
    (re.compile(r"\.feed_forward\.w3\."), ".mlp.up_proj."),
    (re.compile(r"\.feed_forward\.w2\."), ".mlp.down_proj."),
    (re.compile(r"\.self_attn\.out_proj\."), ".self_attn.o_proj."),
    (re.compile(r"\.self_attn\.q_layernorm\."), ".self_attn.q_norm."),
    (re.compile(r"\.self_attn\.k_layernorm\."), ".self_attn.k_norm."),
    (re.compile(r"^model\.embedding_norm\."), "model.norm."),
    # last: the mixer's own out_proj keeps its name (attention's became o_proj above)
    (re.compile(r"^(model\.layers\.\d+\.)conv\."), r"\1self_attn."),
)


class Lfm2ForCausalLM(CausalLM):
    architectures = ("Lfm2ForCausalLM",)
    state_layer_types = frozenset({"conv"})

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        eps = config.hf.norm_eps  # every norm's, the final one's too
        super().__init__(dataclasses.replace(config, rms_norm_eps=eps), quantization)

    def attention_spec(self, index: int) -> AttentionSpec:
        return dataclasses.replace(super().attention_spec(index), qk_norm="head")

    def make_state_mixer(self, index: int) -> nn.Module:
        hf, method = self.config.hf, functools.partial(linear_method_for, self.quantization)
        return ShortConv(self.config.hidden_size, hf.conv_L_cache, bool(hf.conv_bias), method)

    def make_mlp(self, index: int) -> nn.Module:
        method = functools.partial(linear_method_for, self.quantization)
        return GatedMLP(
            self.config.hidden_size, feed_forward_size(self.config.hf), SiluAndMul(), method
        )

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        for pattern, replacement in _RENAMES:
            name = pattern.sub(replacement, name)
        return name


def feed_forward_size(hf) -> int:
    """The MLP's width as transformers' ``Lfm2MLP`` derives it."""
    size = hf.intermediate_size
    if not hf.block_auto_adjust_ff_dim:
        return size
    size = int(2 * size / 3)
    if hf.block_ffn_dim_multiplier is None:
        return size
    size = int(hf.block_ffn_dim_multiplier * size)
    multiple = hf.block_multiple_of
    return multiple * ((size + multiple - 1) // multiple)
