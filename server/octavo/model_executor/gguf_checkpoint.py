"""Reading a GGUF file's tensors under Hugging Face names, kept in their quantized blocks.

The file is memory-mapped by the ``gguf`` package (llama.cpp's own reader, on PyPI);
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and K-quant (Q4_K, Q5_K, Q6_K) matrices are handed over as
``QuantizedTensor`` (the bytes as stored), F32/F16/BF16 ones as float tensors. Each tensor
has its own kind (a ``Q4_K_M`` file mixes Q4_K, Q6_K and others); a layer keeps each of
its checkpoint matrices in its kind. llama.cpp's converter permutes the rows of a Llama's
Q and K projections (its rotary pairs adjacent dimensions); whole rows are moved back
here, so the blocks stay untouched. Any other block kind is refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from octavo.model_executor.layers.quantization.blocks import BlockKind
from octavo.model_executor.layers.quantization.quantized_tensor import QuantizedTensor

KEPT_KINDS = {
    kind.name: kind
    for kind in (
        BlockKind.Q4_0,
        BlockKind.Q4_1,
        BlockKind.Q5_0,
        BlockKind.Q5_1,
        BlockKind.Q8_0,
        BlockKind.Q4_K,
        BlockKind.Q5_K,
        BlockKind.Q6_K,
    )
}
FLOAT_KINDS = ("F32", "F16", "BF16")
SUPPORTED = ", ".join([*KEPT_KINDS, *FLOAT_KINDS])
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` → ``model.layers.3.self_attn.q_proj.weight`` (None: unused)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER.match(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        return None
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{match.group(3)}"


def iterate_gguf(path: Path, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, object]]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    permuted = _field_text(reader, "general.architecture") == "llama"
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        value = _tensor_value(tensor, path)
        if permuted and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = num_heads if "q_proj" in name else num_kv_heads
            value = _unpermute_rows(value, heads)
        yield name, value


def check_gguf_kinds(path: Path) -> None:
    """Refuse, naming it, a block kind Octavo does not keep (before anything loads)."""
    from gguf import GGUFReader

    for tensor in GGUFReader(path).tensors:
        kind = tensor.tensor_type.name
        if hf_name(tensor.name) and kind not in KEPT_KINDS and kind not in FLOAT_KINDS:
            raise unsupported_kind(path, tensor.name, kind)


def unsupported_kind(path: Path, tensor_name: str, kind: str) -> ValueError:
    return ValueError(
        f"{path.name}: tensor {tensor_name} is {kind}, a GGUF block type Octavo does not "
        f"run; supported: {SUPPORTED}"
    )


def _tensor_value(tensor, path: Path):
    kind = tensor.tensor_type.name
    data = np.asarray(tensor.data)
    if kind in KEPT_KINDS:
        rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
        blocks = torch.from_numpy(data.reshape(rows, -1).copy())
        return QuantizedTensor(blocks, KEPT_KINDS[kind], int(tensor.shape[0]))
    if kind in FLOAT_KINDS:
        if kind == "BF16":
            return torch.from_numpy(data.copy()).view(torch.bfloat16).float()
        return torch.from_numpy(data.astype(np.float32))
    raise unsupported_kind(path, tensor.name, kind)


def _unpermute_rows(value, heads: int):
    """Undo llama.cpp's Q/K row order: per head, [pairs, 2] back to [2, pairs]."""
    rows = value.shape[0]
    order = torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)
    if isinstance(value, QuantizedTensor):
        return QuantizedTensor(value.blocks[order].contiguous(), value.kind, value.cols)
    return value[order].contiguous()


def _field_text(reader, key: str) -> str:
    field = reader.fields.get(key)
    if field is None:
        return ""
    return bytes(field.parts[field.data[0]]).decode()
