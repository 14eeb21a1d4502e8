"""GGUF K-quant blocks for tests: random valid blocks, a small K-quantizer, and a GGUF file
of a tiny Llama written with ``gguf.GGUFWriter``.

The ``gguf`` package dequantizes Q4_K/Q5_K/Q6_K but cannot quantize them, so the blocks
are built here byte by byte in llama.cpp's layout (``ggml-common.h``); their meaning is
always checked against ``gguf.quants.dequantize``, never against this file.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as GGML

FP16_OFFSETS = {  # where each kind keeps its fp16 scales (the other bytes are free bits)
    GGML.Q5_0: (0,),
    GGML.Q5_1: (0, 2),
    GGML.Q4_K: (0, 2),
    GGML.Q5_K: (0, 2),
    GGML.Q6_K: (208,),
}


def random_blocks(kind: GGML, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """``[rows, bytes]`` blocks of random bits with finite fp16 scales (zeros, subnormals
    and negatives among them): every scale, min and quant bit pattern occurs."""
    columns, size = gguf.GGML_QUANT_SIZES[kind]
    count = rows * cols // columns
    blocks = rng.integers(0, 256, size=(count, size), dtype=np.uint8)
    for offset in FP16_OFFSETS[kind]:
        scales = rng.standard_normal(count).astype(np.float32)
        scales[::7] = 0.0
        scales[3::11] = 3e-6  # an fp16 subnormal
        halves = scales.astype(np.float16).reshape(count, 1).view(np.uint8)
        blocks[:, offset : offset + 2] = halves
    return blocks.reshape(rows, -1)


def quantize(weight: np.ndarray, kind: GGML) -> np.ndarray:
    """``[rows, cols]`` float32 → ``[rows, bytes]`` blocks of ``kind`` (gguf's own
    quantizer where it has one, else a plain min/max K-quantizer)."""
    if kind in K_QUANTIZERS:
        rows = weight.shape[0]
        return K_QUANTIZERS[kind](weight.reshape(-1, 256).astype(np.float32)).reshape(rows, -1)
    return gguf.quants.quantize(weight.astype(np.float32), kind)


def _fp16_round(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the fp16 bytes, the float32 value they hold)."""
    halves = values.astype(np.float16)
    return halves.view(np.uint8).reshape(len(values), 2), halves.astype(np.float32)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    safe = np.where(denominator == 0, 1.0, denominator)
    return np.where(denominator == 0, 0.0, numerator / safe)


def _k_scales(x: np.ndarray, levels: int):
    """Q4_K/Q5_K: per 32 columns a 6-bit scale and min on top of fp16 d and dmin."""
    low, high = np.minimum(x.min(-1), 0.0), x.max(-1)
    scale, shift = (high - low) / levels, -low
    d_bytes, d = _fp16_round(scale.max(-1) / 63)
    m_bytes, dmin = _fp16_round(shift.max(-1) / 63)
    sc = np.clip(np.rint(_ratio(scale, d[:, None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_ratio(shift, dmin[:, None])), 0, 63).astype(np.uint8)
    step, offset = d[:, None] * sc, dmin[:, None] * mn
    q = np.clip(np.rint(_ratio(x + offset[..., None], step[..., None])), 0, levels)
    packed = np.concatenate(
        [
            (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
            (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4),
        ],
        axis=-1,
    )
    return d_bytes, m_bytes, packed, q.astype(np.uint8)


def _paired_nibbles(q: np.ndarray) -> np.ndarray:
    """``[n, 8, 32]`` → 128 bytes: sub-block 2i in the low nibbles of bytes 32i.., 2i+1 high."""
    pairs = q.reshape(-1, 4, 2, 32) & 15
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)


def _q4_k(weight: np.ndarray) -> np.ndarray:
    d, dmin, packed, q = _k_scales(weight.reshape(-1, 8, 32), 15)
    return np.concatenate([d, dmin, packed, _paired_nibbles(q)], axis=-1)


def _q5_k(weight: np.ndarray) -> np.ndarray:
    d, dmin, packed, q = _k_scales(weight.reshape(-1, 8, 32), 31)
    fifth = ((q >> 4) & 1) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = np.bitwise_or.reduce(fifth, axis=1).astype(np.uint8)
    return np.concatenate([d, dmin, packed, high, _paired_nibbles(q)], axis=-1)


def _q6_k(weight: np.ndarray) -> np.ndarray:
    x = weight.reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d_bytes, d = _fp16_round(scale.max(-1) / 127)
    sc = np.clip(np.rint(_ratio(scale, d[:, None])), -128, 127).astype(np.int8)
    step = (d[:, None] * sc)[..., None]
    q = (np.clip(np.rint(_ratio(x, step)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    low = q & 15
    ql = (low[:, :, :2] | (low[:, :, 2:] << 4)).reshape(-1, 128)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    qh = np.bitwise_or.reduce(((q >> 4) & 3) << shifts, axis=2).astype(np.uint8).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d_bytes], axis=-1)


K_QUANTIZERS = {GGML.Q4_K: _q4_k, GGML.Q5_K: _q5_k, GGML.Q6_K: _q6_k}


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row order (its rotary pairs adjacent dimensions)."""
    per_head = rows.shape[0] // heads
    shaped = rows.reshape(heads, 2, per_head // 2, *rows.shape[1:])
    return shaped.swapaxes(1, 2).reshape(rows.shape)


_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    module, _, suffix = rest.rpartition(".")
    return f"blk.{layer}.{_GGUF_NAMES[module]}.{suffix}"


def write_llama_gguf(
    path: Path, folder: Path, kinds: dict[str, GGML], tokenizer_gguf: Path
) -> dict[str, torch.Tensor]:
    """``folder``'s tiny Llama (tied embeddings) as a GGUF: each matrix quantized to
    ``kinds[its gguf name]``, norms F32, the tokenizer copied from ``tokenizer_gguf``.
    Returns the state dict of the dequantized weights (what the file stands for)."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    writer = gguf.GGUFWriter(str(path), "llama")
    _write_config(writer, config)
    copy_tokenizer(writer, tokenizer_gguf)
    dequantized = {}
    for name, tensor in state.items():
        if name == "lm_head.weight":
            continue  # tied
        dequantized[name] = _add_tensor(writer, name, tensor.float().numpy(), kinds, config)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dequantized


def _add_tensor(writer, name: str, weight: np.ndarray, kinds, config) -> torch.Tensor:
    target = gguf_name(name)
    if weight.ndim == 1:
        writer.add_tensor(target, weight)
        return torch.from_numpy(weight.copy())
    kind = kinds[target]
    blocks = quantize(weight, kind)
    expanded = gguf.quants.dequantize(blocks, kind).reshape(weight.shape)
    if target.endswith(("attn_q.weight", "attn_k.weight")):
        heads = config["num_attention_heads" if "attn_q" in target else "num_key_value_heads"]
        blocks = llama_cpp_permute(blocks, heads)
    writer.add_tensor(target, blocks, raw_dtype=kind)
    return torch.from_numpy(expanded.copy())


def write_shape(writer, config: dict) -> None:
    """The hyperparameters convert_hf_to_gguf.py writes for every decoder architecture."""
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(rope_theta(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])


def rope_theta(config: dict) -> float:
    """The (full-attention) rope theta, transformers 5's ``rope_parameters`` or 4's key."""
    rope = config.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    return float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


def _write_config(writer, config: dict) -> None:
    write_shape(writer, config)
    writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])


def copy_tokenizer(writer, source: Path, vocab_size: int | None = None) -> None:
    """``source``'s tokenizer metadata; with ``vocab_size``, only its first tokens (and the
    merges among them): a small vocabulary reads back fast."""
    for key, (value, value_type, sub_type) in _tokenizer_fields(source).items():
        if vocab_size is not None and key in _PER_TOKEN:
            value = value[:vocab_size]
        if vocab_size is not None and key == "tokenizer.ggml.merges":
            kept = set(_tokenizer_fields(source)["tokenizer.ggml.tokens"][0][:vocab_size])
            value = [m for m in value if {*m.split(" "), m.replace(" ", "")} <= kept]
        writer.add_key_value(key, value, value_type, sub_type)


_PER_TOKEN = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")


@lru_cache(maxsize=2)
def _tokenizer_fields(source: Path) -> dict[str, tuple]:
    """(value, type, array item type) of each ``tokenizer.*`` key (read once: gguf's reader
    takes seconds over a 49k-token vocabulary)."""
    fields = {}
    for key, field in gguf.GGUFReader(source).fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if len(field.types) > 1 else None
            fields[key] = (field.contents(), field.types[0], sub_type)
    return fields
