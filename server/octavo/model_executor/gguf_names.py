"""A GGUF file's tensor names in Hugging Face's naming, from the ``gguf`` package's tables.

``gguf.get_tensor_name_map(arch, n_blocks)`` (llama.cpp's own converter table) maps every
HF spelling it knows of a tensor to its GGUF name, per architecture (``blk.0.ffn_norm`` is
``post_attention_layernorm`` for Llama but ``pre_feedforward_layernorm`` for Gemma 2).
Reversed, a GGUF name has several HF candidates (``model.layers.0.self_attn.q_proj``,
``model.layers.0.attention.wq``, ...); the one kept is the first of ``PREFERRED`` (the
spellings of the transformers checkpoints Octavo's models read), or the architecture's
own choice where two of those fit (its model class's ``gguf_layout.tensor_choices``:
Phi-3 stores gate and up fused in ``ffn_up``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

PREFERRED = (  # layer-relative HF module names Octavo's models read, best first
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "self_attn.qkv_proj",
    "self_attn.q_norm",
    "self_attn.k_norm",
    "self_attn.sinks",
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "mlp.gate",  # a MoE block's router (Qwen-MoE)
)
GLOBAL_NAMES = ("model.embed_tokens", "model.norm", "lm_head")
BARE_PARAMETERS = ("self_attn.sinks",)  # HF parameters without .weight (the file adds it)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class GgufNames:
    """GGUF base name (``blk.3.attn_q``) → HF base name for one architecture."""

    arch: str
    to_hf: dict[str, str]

    def hf_name(self, gguf_name: str) -> str | None:
        """``blk.3.attn_q.weight`` → ``model.layers.3.self_attn.q_proj.weight`` (None:
        a tensor Octavo does not read, e.g. ``rope_freqs``)."""
        base, dot, suffix = gguf_name.rpartition(".")
        if suffix not in ("weight", "bias") or not dot:
            base, suffix = gguf_name, ""
        hf = self.to_hf.get(base)
        if hf is None:
            return None
        return f"{hf}.{suffix}" if suffix and not hf.endswith(BARE_PARAMETERS) else hf


def gguf_names(arch: str, num_blocks: int, choices: Mapping[str, str]) -> GgufNames:
    """The name table of GGUF architecture ``arch`` (``general.architecture``);
    ``choices``: the architecture's own spelling of some layer parts."""
    import gguf

    known = {name: enum for enum, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in known:
        raise ValueError(f"GGUF architecture {arch!r} is not one the gguf package knows")
    mapping = gguf.get_tensor_name_map(known[arch], num_blocks).mapping
    ranked: dict[str, tuple[int, str]] = {}
    for hf, (_, gguf_base) in mapping.items():
        rank = _rank(choices, hf, gguf_base)
        if rank is not None and (gguf_base not in ranked or rank < ranked[gguf_base][0]):
            ranked[gguf_base] = (rank, hf)
    return GgufNames(arch, {base: hf for base, (_, hf) in ranked.items()})


def _rank(choices: Mapping[str, str], hf: str, gguf_base: str) -> int | None:
    """How preferred HF spelling ``hf`` is for ``gguf_base`` (lower first; None: never)."""
    if hf in GLOBAL_NAMES:
        return 0
    layer, gguf_layer = _LAYER.match(hf), _GGUF_LAYER.match(gguf_base)
    if layer is None or gguf_layer is None or layer.group(1) != gguf_layer.group(1):
        return None
    part, gguf_part = layer.group(2), gguf_layer.group(2)
    chosen = choices.get(gguf_part)
    if chosen is not None:
        return 0 if part == chosen else None
    return PREFERRED.index(part) if part in PREFERRED else None
