"""How llama.cpp's converter writes one architecture's checkpoint as a GGUF file.

A model class that reads GGUF files declares one (``gguf_layout``); ``registry`` finds
the class of a file's ``general.architecture``. What is common to every architecture (the
``gguf`` package's name table, the block kinds) stays in ``gguf_names`` and
``gguf_checkpoint``; only the choices that differ per architecture are here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GgufLayout:
    arch: str  # the file's ``general.architecture``
    # layer-relative GGUF name -> the HF spelling kept where the gguf package's table
    # offers several (Phi-3 stores gate and up fused in ``ffn_up``)
    tensor_choices: Mapping[str, str] = field(default_factory=dict)
    permuted_qk: bool = False  # Q/K rows permuted for Llama's rotary (converted as Llama)
    norm_plus_one: bool = False  # norm weights stored plus one (Gemma's 1 + w)
    # the layer's MoE block whose experts the file stacks (``ffn_*_exps``); None: no MoE.
    # Their names in the block are the class's ``expert_names``.
    moe_block: str | None = None
    # the HF model type Octavo writes the config as, where transformers' GGUF reader does
    # not describe the architecture (None: transformers does), and the metadata keys
    # beyond the common ones it reads (``{arch}.key`` -> config attribute)
    model_type: str | None = None
    config_keys: Mapping[str, str] = field(default_factory=dict)


def layout_of(cls: type | None, arch: str) -> GgufLayout:
    """``cls``'s own declared layout, or the plain one of ``arch`` (no class reads it)."""
    declared = None if cls is None else vars(cls).get("gguf_layout")
    return declared if declared is not None else GgufLayout(arch)


def file_layout(arch: str, with_experts: bool = False) -> tuple[type | None, GgufLayout]:
    """The model class that reads GGUF files of ``arch`` (None: none) and its layout;
    ``with_experts``: the file stacks MoE experts."""
    from octavo.model_executor.models.registry import gguf_class

    cls = gguf_class(arch, with_experts)
    return cls, layout_of(cls, arch)
