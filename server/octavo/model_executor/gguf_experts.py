"""A GGUF MoE's stacked experts in the checkpoint layout Octavo's MoE blocks read.

llama.cpp's converter stacks each projection over the experts (``blk.3.ffn_up_exps
[E, I, H]``, ``ffn_down_exps [E, H, I]``, biases ``[E, I]``). Mixtral and Qwen-MoE
checkpoints name one tensor per expert, so the stack is split; gpt-oss's stacks gate and
up interleaved (``experts.gate_up_proj [E, H, 2I]``), so the converter's split is undone
(its gate half and up half are held until both have been read). Tensors are expanded to
float: the experts run unquantized.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

PER_EXPERT = {  # GGUF arch -> stacked projection -> one expert's HF name in its layer
    "llama": {  # Mixtral, converted as a Llama with experts
        "ffn_gate_exps": "block_sparse_moe.experts.{e}.w1.weight",
        "ffn_up_exps": "block_sparse_moe.experts.{e}.w3.weight",
        "ffn_down_exps": "block_sparse_moe.experts.{e}.w2.weight",
    },
    "qwen3moe": {
        "ffn_gate_exps": "mlp.experts.{e}.gate_proj.weight",
        "ffn_up_exps": "mlp.experts.{e}.up_proj.weight",
        "ffn_down_exps": "mlp.experts.{e}.down_proj.weight",
    },
}
STACKED_ARCHS = ("gpt-oss",)
MOE_ARCHS = (*PER_EXPERT, *STACKED_ARCHS)


class ExpertReader:
    """Turns a file's expert tensors into checkpoint tensors, in the order they come."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.halves: dict[tuple[str, str], dict[str, torch.Tensor]] = {}

    def read(self, tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Nothing for a tensor that is not a known architecture's stacked experts."""
        layer, _, rest = tensor.name.removeprefix("blk.").partition(".")
        part, _, kind = rest.rpartition(".")
        if not layer.isdigit() or not part.endswith("_exps") or kind not in ("weight", "bias"):
            return
        if self.arch in PER_EXPERT:
            yield from self._per_expert(layer, part, kind, tensor)
        elif self.arch in STACKED_ARCHS:
            yield from self._gpt_oss(layer, part, kind, _expand(tensor))

    def _per_expert(self, layer: str, part: str, kind: str, tensor):
        pattern = PER_EXPERT[self.arch].get(part)
        if pattern is None or kind != "weight":
            return
        for expert, matrix in enumerate(_expand(tensor)):
            yield f"model.layers.{layer}.{pattern.format(e=expert)}", matrix

    def _gpt_oss(self, layer: str, part: str, kind: str, value: torch.Tensor):
        prefix = f"model.layers.{layer}.mlp.experts."
        suffix = "_bias" if kind == "bias" else ""
        if part == "ffn_down_exps":
            yield prefix + "down_proj" + suffix, value if suffix else value.transpose(1, 2)
            return
        if part == "ffn_gate_up_exps":  # a file written with gate and up fused
            gate, up = value.chunk(2, dim=1)
            yield prefix + "gate_up_proj" + suffix, _interleave(gate, up, kind)
            return
        halves = self.halves.setdefault((layer, kind), {})
        halves[part] = value
        if len(halves) == 2:
            del self.halves[(layer, kind)]
            gate, up = halves["ffn_gate_exps"], halves["ffn_up_exps"]
            yield prefix + "gate_up_proj" + suffix, _interleave(gate, up, kind)


def _interleave(gate: torch.Tensor, up: torch.Tensor, kind: str) -> torch.Tensor:
    """gpt-oss's gate/up: weights ``[E, I, H]`` each → ``[E, H, 2I]`` (gate at even
    columns), biases ``[E, I]`` each → ``[E, 2I]``."""
    if kind == "bias":
        return torch.stack([gate, up], dim=2).flatten(1)
    experts, inter, hidden = gate.shape
    rows = torch.stack([gate, up], dim=2).reshape(experts, 2 * inter, hidden)
    return rows.transpose(1, 2)


def _expand(tensor) -> torch.Tensor:
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
