"""Linear layers that know their tensor-parallel shard (Megatron's / vLLM's layout).

- ``ColumnParallelLinear``: the output features are split across ranks (no communication).
- ``MergedColumnParallelLinear``: several column-parallel matrices stored as one (gate/up).
- ``QKVParallelLinear``: query, key and value heads split across ranks; KV heads are
  replicated when there are fewer of them than ranks.
- ``RowParallelLinear``: the input features are split; the partial outputs are summed
  with one all-reduce, and the bias is added once, after it.

Each layer's ``weight_loader`` copies its rank's slice of a checkpoint tensor; its
``LinearMethod`` (``linear_method.py``) owns the storage and the matmul.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.distributed.parallel_state import tensor_parallel_group
from octavo.model_executor.checkpoint_slice import materialize
from octavo.model_executor.layers.linear_method import LinearMethod, UnquantizedLinearMethod


class LinearBase(nn.Module):
    def __init__(
        self, input_size: int, output_size: int, bias: bool, method: LinearMethod | None
    ) -> None:
        super().__init__()
        self.tp = tensor_parallel_group()
        self.input_size, self.output_size = input_size, output_size  # this rank's shard
        self.method = method or UnquantizedLinearMethod()
        self.method.create_weights(self, input_size, output_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def process_weights_after_loading(self) -> None:
        self.method.process_weights_after_loading(self)

    @property
    def is_unquantized(self) -> bool:
        return type(self.method) is UnquantizedLinearMethod


def copy_checked(target, source, name: str) -> None:
    """Copy a checkpoint tensor (or a lazily read one, whole) after checking its shape; a
    quantized weight slot (not a tensor) keeps a quantized source as it is."""
    if target.shape != source.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(source.shape)} != {tuple(target.shape)}")
    target.copy_(materialize(source) if isinstance(target, torch.Tensor) else source)


class ColumnParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, method=None):
        start, end = tensor_parallel_group().shard(output_size, "output features")
        super().__init__(input_size, end - start, bias, method)
        self.output_start = start

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
        rows = loaded.narrow(0, self.output_start, self.output_size)
        copy_checked(param, rows, name)


class MergedColumnParallelLinear(LinearBase):
    """``len(output_sizes)`` column-parallel matrices side by side; shard ``i`` is one."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False, method=None):
        tp = tensor_parallel_group()
        self.total_output_sizes = list(output_sizes)  # the whole checkpoint's, per shard
        self.shards = [tp.shard(size, "output features") for size in output_sizes]
        super().__init__(input_size, sum(end - start for start, end in self.shards), bias, method)

    def weight_loader(self, param, loaded: torch.Tensor, name: str, shard_id: int) -> None:
        start, end = self.shards[shard_id]
        offset = sum(e - s for s, e in self.shards[:shard_id])
        copy_checked(
            param.narrow(0, offset, end - start), loaded.narrow(0, start, end - start), name
        )


class QKVParallelLinear(LinearBase):
    def __init__(
        self,
        hidden: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        method=None,
    ) -> None:
        tp = tensor_parallel_group()
        first_head, last_head = tp.shard(num_heads, "attention heads")
        self.num_heads = last_head - first_head
        self.num_kv_heads = max(1, num_kv_heads // tp.size)
        if num_kv_heads >= tp.size:
            first_kv = tp.shard(num_kv_heads, "KV heads")[0]
        else:  # fewer KV heads than ranks: each rank keeps the one its query heads use
            if tp.size % num_kv_heads:
                raise ValueError(f"{num_kv_heads} KV heads cannot be spread over {tp.size} ranks")
            first_kv = tp.rank * num_kv_heads // tp.size
        self.head_dim = head_dim
        kv_rows = num_kv_heads * head_dim  # rows of each matrix in the whole checkpoint
        self.total_rows = {"q": num_heads * head_dim, "k": kv_rows, "v": kv_rows}
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.sources = {  # shard id -> (first row in the checkpoint, rows, offset here)
            "q": (first_head * head_dim, self.q_size, 0),
            "k": (first_kv * head_dim, self.kv_size, self.q_size),
            "v": (first_kv * head_dim, self.kv_size, self.q_size + self.kv_size),
        }
        super().__init__(hidden, self.q_size + 2 * self.kv_size, bias, method)

    def weight_loader(self, param, loaded: torch.Tensor, name: str, shard_id: str) -> None:
        start, rows, offset = self.sources[shard_id]
        copy_checked(param.narrow(0, offset, rows), loaded.narrow(0, start, rows), name)


class RowParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, method=None):
        start, end = tensor_parallel_group().shard(input_size, "input features")
        self.input_start = start
        super().__init__(end - start, output_size, False, method)
        self.reduced_bias = (
            nn.Parameter(torch.empty(output_size), requires_grad=False) if bias else None
        )

    def weight_loader(self, param, loaded: torch.Tensor, name: str) -> None:
        if param is self.reduced_bias:  # the bias is whole on every rank, added once
            copy_checked(param, loaded, name)
            return
        copy_checked(param, loaded.narrow(1, self.input_start, self.input_size), name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp.all_reduce(self.method.apply(self, x))
        return out if self.reduced_bias is None else out + self.reduced_bias
