"""CUDA's allocator statistics, faked on CPU: the bytes of tensors created inside
``PeakMemory()`` that are still alive, and their peak (``max_memory_allocated`` above
the start).

Every op's output is counted once per storage, when an op creates it; an output that
views a storage made before the mode (weights, a KV cache written in place) is not new
memory. A storage is freed when the last tensor the mode saw on it is gone. Memory an
op allocates and frees inside itself (a GEMM's scratch) is not seen, on either side of
a comparison.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakMemory(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._tensors: dict[int, int] = {}  # storage pointer -> live tensors seen on it
        self._sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        before = {_storage(t) for t in tree_leaves((args, kwargs)) if _tracked_type(t)}
        for tensor in tree_leaves(result):
            if _tracked_type(tensor):
                self._see(tensor, _storage(tensor), before)
        return result

    def _see(self, tensor: torch.Tensor, key: int, inputs: set[int]) -> None:
        if key not in self._tensors and key in inputs:
            return  # written in place or viewed: memory made before the mode
        if key not in self._tensors:
            self._sizes[key] = tensor.untyped_storage().nbytes()
            self._tensors[key] = 0
            self.live += self._sizes[key]
            self.peak = max(self.peak, self.live)
        self._tensors[key] += 1
        weakref.finalize(tensor, self._release, key)

    def _release(self, key: int) -> None:
        self._tensors[key] -= 1
        if self._tensors[key] == 0:
            del self._tensors[key]
            self.live -= self._sizes.pop(key)


def _tracked_type(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()
