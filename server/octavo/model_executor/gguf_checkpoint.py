"""Reading a GGUF file's tensors under Hugging Face names, kept in their quantized blocks.

The file's header is parsed by the ``gguf`` package (llama.cpp's own reader, on PyPI) once
and indexed (``gguf_index.py``), the file memory-mapped;
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and K-quant (Q4_K, Q5_K, Q6_K) matrices are handed over as
``QuantizedTensor`` (the bytes as stored), F32/F16/BF16 ones as float tensors. Each tensor
has its own kind (a ``Q4_K_M`` file mixes Q4_K, Q6_K and others); a layer keeps each of
its checkpoint matrices in its kind. Names come from the gguf package's tables for the
file's architecture (``gguf_names.py``), and what differs per architecture from the
model class that reads it (``gguf_layout``). llama.cpp's converter permutes the rows of
the Q and K projections of the architectures it runs with Llama's rotary (adjacent
dimensions paired: Llama, Mistral, Granite, SmolLM3); whole rows are moved back here, so
the blocks stay untouched. A MoE's stacked experts go through ``gguf_experts.py``
(expanded to float, in the checkpoint's layout). It stores Gemma's norm weights plus one
(llama.cpp multiplies by the weight, Gemma by one plus it); one is taken off again. Any
other block kind is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from octavo.model_executor.gguf_experts import ExpertReader
from octavo.model_executor.gguf_index import GgufIndex, read_index
from octavo.model_executor.gguf_layout import file_layout
from octavo.model_executor.gguf_names import GgufNames, gguf_names
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


@lru_cache(maxsize=16)
def _names(arch: str, num_blocks: int) -> GgufNames:
    return gguf_names(arch, num_blocks, file_layout(arch)[1].tensor_choices)


def expert_archs() -> list[str]:
    """The GGUF architectures whose stacked experts a model class reads."""
    from octavo.model_executor.models.registry import GGUF_MANIFEST, gguf_class

    return [arch for arch in GGUF_MANIFEST if gguf_class(arch, with_experts=True)]


def hf_name(gguf_name: str, arch: str = "llama", num_blocks: int = 0) -> str | None:
    """``blk.3.attn_q.weight`` → ``model.layers.3.self_attn.q_proj.weight`` (None: unused)."""
    parts = gguf_name.split(".")
    if len(parts) > 1 and parts[0] == "blk" and parts[1].isdigit():
        num_blocks = max(num_blocks, int(parts[1]) + 1)
    return _names(arch, num_blocks).hf_name(gguf_name)


def open_gguf(path: Path) -> GgufIndex:
    """The file's tensors and plain fields: parsed by the ``gguf`` package the first time
    (its 49k-token vocabulary, in Python, takes seconds), then from a cached index
    (``gguf_index``); the kinds check and the load of one process share one read."""
    stat = path.stat()
    return _open_gguf(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _open_gguf(path: str, mtime_ns: int, size: int) -> GgufIndex:
    return read_index(Path(path))


def iterate_gguf(path: Path, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, object]]:
    reader = open_gguf(path)
    arch, blocks = file_architecture(reader)
    cls, layout = file_layout(arch, with_experts=_has_experts(reader))
    experts = ExpertReader(layout.moe_block, getattr(cls, "expert_names", None))
    for tensor in reader.tensors:
        name = hf_name(tensor.name, arch, blocks)
        if name is None:
            yield from experts.read(tensor)
            continue
        value = _tensor_value(tensor, path)
        if layout.permuted_qk and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = num_heads if "q_proj" in name else num_kv_heads
            value = _unpermute_rows(value, heads)
        if layout.norm_plus_one and name.endswith("norm.weight"):
            value = value - 1.0
        yield name, value


def _has_experts(reader: GgufIndex) -> bool:
    return any(tensor.name.endswith("_exps.weight") for tensor in reader.tensors)


def file_architecture(reader: GgufIndex) -> tuple[str, int]:
    """``general.architecture`` and its block count (the metadata llama.cpp writes)."""
    arch = str(reader.fields.get("general.architecture") or "llama")
    return arch, int(reader.fields.get(f"{arch}.block_count", 0))


def check_gguf_kinds(path: Path) -> None:
    """Refuse, naming it, a block kind Octavo does not keep (before anything loads)."""
    reader = open_gguf(path)
    arch, blocks = file_architecture(reader)
    for tensor in reader.tensors:
        if tensor.name.endswith("_exps.weight") and file_layout(arch, True)[0] is None:
            raise ValueError(
                f"{path.name}: the MoE experts of GGUF architecture {arch!r} are not "
                f"supported yet (GGUF MoE files: {', '.join(expert_archs())})"
            )
        kind = tensor.tensor_type.name
        known = kind in KEPT_KINDS or kind in FLOAT_KINDS
        if hf_name(tensor.name, arch, blocks) and not known:
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
