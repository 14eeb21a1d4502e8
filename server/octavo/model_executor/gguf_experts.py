"""A GGUF MoE's stacked experts in the checkpoint layout Octavo's MoE blocks read.

llama.cpp's converter stacks each projection over the experts (``blk.3.ffn_up_exps
[E, I, H]``, ``ffn_down_exps [E, H, I]``, biases ``[E, I]``). Where the model class's
``expert_names`` name one tensor per expert (Mixtral, Qwen-MoE) the stack is split;
gpt-oss's stacks gate and up interleaved (``experts.gate_up_proj [E, H, 2I]``), so the
converter's split is undone (its gate half and up half are held until both have been
read). Tensors are expanded to
float: the experts run unquantized.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from octavo.model_executor.layers.moe.names import ExpertNames


class ExpertReader:
    """Turns a file's expert tensors into checkpoint tensors, in the order they come:
    ``block`` is the layer's MoE module, ``names`` its experts' names there (the model
    class's ``expert_names``); None: the file's experts are not read."""

    def __init__(self, block: str | None, names: ExpertNames | None) -> None:
        self.block, self.names = block, names
        self.halves: dict[tuple[str, str], dict[str, torch.Tensor]] = {}

    def read(self, tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Nothing for a tensor that is not stacked experts the model reads."""
        layer, _, rest = tensor.name.removeprefix("blk.").partition(".")
        part, _, kind = rest.rpartition(".")
        if not layer.isdigit() or not part.endswith("_exps") or kind not in ("weight", "bias"):
            return
        if self.block is None or self.names is None:
            return
        prefix = f"model.layers.{layer}.{self.block}."
        if self.names.fused:
            yield from self._stacked(layer, prefix, part, kind, _expand(tensor))
        else:
            yield from self._per_expert(prefix, part, kind, tensor)

    def _per_expert(self, prefix: str, part: str, kind: str, tensor):
        names = self.names
        pattern = {"ffn_gate_exps": names.gate, "ffn_up_exps": names.up}.get(part)
        pattern = names.down if part == "ffn_down_exps" else pattern
        if pattern is None or kind != "weight":
            return
        for expert, matrix in enumerate(_expand(tensor)):
            yield prefix + pattern.format(e=expert), matrix

    def _stacked(self, layer: str, prefix: str, part: str, kind: str, value: torch.Tensor):
        """gpt-oss's layout: gate and up interleaved in one stack, down transposed."""
        bias = kind == "bias"
        names = self.names
        gate_up = names.fused_gate_up_bias if bias else names.fused_gate_up
        if part == "ffn_down_exps":
            name = names.fused_down_bias if bias else names.fused_down
            yield prefix + name, value if bias else value.transpose(1, 2)
            return
        if part == "ffn_gate_up_exps":  # a file written with gate and up fused
            gate, up = value.chunk(2, dim=1)
            yield prefix + gate_up, _interleave(gate, up, kind)
            return
        halves = self.halves.setdefault((layer, kind), {})
        halves[part] = value
        if len(halves) == 2:
            del self.halves[(layer, kind)]
            gate, up = halves["ffn_gate_exps"], halves["ffn_up_exps"]
            yield prefix + gate_up, _interleave(gate, up, kind)


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
