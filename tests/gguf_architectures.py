"""A tiny transformers checkpoint of any architecture written as a GGUF file, as llama.cpp's
``convert_hf_to_gguf.py`` writes it: names from the ``gguf`` package's own table
(``gguf.get_tensor_name_map``), Q/K rows permuted for the architectures it converts as a
Llama, Gemma's norm weights stored plus one, and the metadata keys it writes per
architecture. Matrices stay F32 or are quantized with gguf's own quantizer (Q8_0)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as GGML

from gguf_kquants import copy_tokenizer, llama_cpp_permute, write_shape

PERMUTED = ("llama", "granite", "smollm3")
NORM_PLUS_ONE = ("gemma2", "gemma3")
EXPERT = re.compile(r"^(model\.layers\.\d+\.\w+\.experts)\.(\d+)\.(\w+)\.weight$")


def write_gguf(
    path: Path,
    folder: Path,
    arch: str,
    tokenizer_gguf: Path,
    kind: GGML = GGML.F32,
) -> dict[str, torch.Tensor]:
    """``folder``'s checkpoint as a GGUF of ``arch``, matrices in ``kind`` (stacked experts
    F32); returns the state dict the file stands for (the matrices as ``kind`` rounds
    them)."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    arch_enum = {name: enum for enum, name in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(arch_enum, config["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(path), arch)
    write_metadata(writer, config, arch)
    copy_tokenizer(writer, tokenizer_gguf, config["vocab_size"])
    stored = {}
    tensors = stack_experts(state).items()
    if arch == "gpt-oss":
        tensors = [pair for name, tensor in tensors for pair in gpt_oss_tensors(name, tensor)]
    for name, tensor in tensors:
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, f"gguf has no name for {name}"
        stored[name] = _add_tensor(writer, target, tensor.float().numpy(), arch, config, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def stack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert matrices (``...experts.3.up_proj.weight``) stacked as the converter does
    (``...experts.up_proj.weight [E, I, H]``); other tensors as they are."""
    out, experts = {}, {}
    for name, tensor in state.items():
        match = EXPERT.match(name)
        if match is None:
            out[name] = tensor
            continue
        key = f"{match.group(1)}.{match.group(3)}.weight"
        experts.setdefault(key, {})[int(match.group(2))] = tensor
    for key, by_index in experts.items():
        out[key] = torch.stack([by_index[e] for e in sorted(by_index)])
    return out


def gpt_oss_tensors(name: str, tensor: torch.Tensor):
    """The converter's GptOssModel.modify_tensors on float experts: gate/up split from their
    interleaving and transposed to ``[E, I, H]``, down to ``[E, H, I]``; sinks + .weight."""
    if name.endswith("self_attn.sinks"):
        yield name + ".weight", tensor
    elif name.endswith("experts.gate_up_proj"):
        rows = tensor.transpose(-1, -2)
        yield name.replace("gate_up_proj", "gate_proj.weight"), rows[:, ::2].contiguous()
        yield name.replace("gate_up_proj", "up_proj.weight"), rows[:, 1::2].contiguous()
    elif name.endswith("experts.gate_up_proj_bias"):
        yield name.replace("gate_up_proj_bias", "gate_proj.bias"), tensor[..., ::2].contiguous()
        yield name.replace("gate_up_proj_bias", "up_proj.bias"), tensor[..., 1::2].contiguous()
    elif name.endswith("experts.down_proj"):
        yield name + ".weight", tensor.transpose(-1, -2).contiguous()
    elif name.endswith("experts.down_proj_bias"):
        yield name.replace("down_proj_bias", "down_proj.bias"), tensor
    else:
        yield name, tensor


def _add_tensor(writer, target: str, weight: np.ndarray, arch: str, config, kind):
    if weight.ndim == 3:  # stacked experts
        writer.add_tensor(target, weight)
        return torch.from_numpy(weight.copy())
    if weight.ndim == 1:
        shift = 1.0 if arch in NORM_PLUS_ONE and target.endswith("norm.weight") else 0.0
        writer.add_tensor(target, (weight + shift).astype(np.float32))
        return torch.from_numpy(weight.copy())
    if kind == GGML.F32:
        data, expanded = weight, weight
    else:
        data = gguf.quants.quantize(weight, kind)
        expanded = gguf.quants.dequantize(data, kind).reshape(weight.shape)
    if arch in PERMUTED and target.endswith(("attn_q.weight", "attn_k.weight")):
        heads = config["num_attention_heads" if "attn_q" in target else "num_key_value_heads"]
        data = llama_cpp_permute(data, heads)
    writer.add_tensor(target, data, raw_dtype=None if kind == GGML.F32 else kind)
    return torch.from_numpy(np.ascontiguousarray(expanded))


def write_metadata(writer, config: dict, arch: str) -> None:
    """The hyperparameters convert_hf_to_gguf.py writes for these architectures."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    write_shape(writer, config)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if arch in PERMUTED or arch == "phi3":
        writer.add_rope_dimension_count(head_dim)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if arch == "granite":
        writer.add_embedding_scale(config["embedding_multiplier"])
        writer.add_residual_scale(config["residual_multiplier"])
        writer.add_attention_scale(config["attention_multiplier"])
        writer.add_logit_scale(config["logits_scaling"])
    experts = config.get("num_experts", config.get("num_local_experts"))  # transformers 4, 5
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if "moe_intermediate_size" in config:
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "gpt-oss":
        writer.add_sliding_window(config["sliding_window"])
        rope = config["rope_parameters"]
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if arch in NORM_PLUS_ONE and config.get("sliding_window"):
        writer.add_sliding_window(config["sliding_window"])
