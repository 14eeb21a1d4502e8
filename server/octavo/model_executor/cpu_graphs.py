"""Decode graphs on CPU: a decode forward's op calls recorded once, then replayed.

An eager decode step of a small model on CPU spends much of its time between kernels: the
Python of 30 layers' modules, views and dispatch (SmolLM2-135M on 2 Xeon vCPUs: 7.9 ms of
a ~30 ms batch-1 step, measured with a 64-wide model of the same 30 layers). The CUDA
answer, a graph, has a CPU counterpart that needs no driver: run the forward once under a
``TorchDispatchMode`` that writes down every op that reaches the dispatcher, with the
tensors it read and wrote, and replay only the ops that write data. Views, reshapes and
allocations are left out of the replay (their tensors already exist, over the same
memory), so a SmolLM2 step replays ~300 calls, nearly all Octavo's kernels.

This is sound for the same forwards a CUDA graph is: every decision on the host depends
only on the batch size, and every value the kernels read comes from tensors (the
persistent ``DecodeBuffers``, the weights, the cache). An op that reads a tensor's value
on the host, or whose output shape depends on values, cannot be recorded
(``NotRecordable``: the decode steps stay eager, and the log says which op). A host read
that bypasses the dispatcher (``tolist``) is caught by the capture check in
``DecodeGraphs``: the replay must give the eager forward's logits bit for bit on inputs
unlike the recorded ones.

The recorded tensors stay allocated: a graph per size keeps its batch's activations
(``recorded_bytes``), which is why the CPU's default sizes stop at 64 rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

ALLOCATIONS = frozenset(
    {
        torch.ops.aten.empty.memory_format,
        torch.ops.aten.empty_strided.default,
        torch.ops.aten.empty_like.default,
    }
)
# Ops whose result depends on values in a way a replay would not redo: a value read on the
# host, an output shape read from the data, fresh random numbers.
UNRECORDABLE_TAGS = (
    torch.Tag.data_dependent_output,
    torch.Tag.dynamic_output_shape,
    torch.Tag.nondeterministic_seeded,
)


class NotRecordable(RuntimeError):
    """The forward cannot be replayed from a recording (the reason says why)."""


@dataclass(frozen=True)
class TapeStep:
    """One recorded op: ``op(*args, **kwargs)``, its tensors as they were at the call.
    ``outputs`` holds a functional op's results, which a replay copies its new results
    into; an op that writes its arguments (Octavo's kernels, ``copy_``) has none."""

    op: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    outputs: tuple[torch.Tensor, ...] | None

    def run(self) -> None:
        result = self.op(*self.args, **self.kwargs)
        if self.outputs is None:
            return
        results = result if isinstance(result, (tuple, list)) else (result,)
        for recorded, fresh in zip(self.outputs, results, strict=True):
            recorded.copy_(fresh)


def _frozen(value):
    """A tensor argument as a new alias of its memory with its shape at the call, so a
    later in-place view op (``unsqueeze_``) cannot change what a replay passes."""
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        return value.as_strided(value.size(), value.stride(), value.storage_offset())
    return value


def _integer_index(op: torch._ops.OpOverload, args: tuple) -> bool:
    """``x[rows]`` with integer indices: tagged as a dynamic shape for the boolean masks
    the same op takes, but its shape is the indices'."""
    if op is not torch.ops.aten.index.Tensor:
        return False
    indices = [i for i in args[1] if i is not None]
    return all(
        not i.dtype.is_floating_point and i.dtype not in (torch.bool, torch.uint8) for i in indices
    )


def _writes_arguments(op: torch._ops.OpOverload) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


class TapeMode(TorchDispatchMode):
    """Runs every op as usual and writes down the ones a replay must run again."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[TapeStep] = []
        self.recorded_bytes = 0

    def __torch_dispatch__(self, op, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = op(*args, **kwargs)
        if op in ALLOCATIONS:
            self.recorded_bytes += result.untyped_storage().nbytes()
            return result
        if op.is_view or torch.Tag.inplace_view in op.tags:
            return result  # metadata over memory that already exists
        if any(tag in op.tags for tag in UNRECORDABLE_TAGS) and not _integer_index(op, args):
            raise NotRecordable(f"{op} depends on tensor values on the host")
        self.steps.append(self._step(op, args, kwargs, result))
        return result

    def _step(self, op, args, kwargs, result) -> TapeStep:
        args, kwargs = tree_map(_frozen, args), tree_map(_frozen, kwargs)
        if _writes_arguments(op):
            return TapeStep(op, args, kwargs, None)
        results = result if isinstance(result, (tuple, list)) else (result,)
        if not all(isinstance(r, torch.Tensor) for r in results):
            raise NotRecordable(f"{op} returns {type(result).__name__} to the host")
        self.recorded_bytes += sum(r.untyped_storage().nbytes() for r in results)
        return TapeStep(op, args, kwargs, tuple(_frozen(r) for r in results))


@dataclass(frozen=True)
class Tape:
    """A recorded forward: calling it runs the steps again and returns the output tensor
    the forward returned (now holding the new result)."""

    steps: tuple[TapeStep, ...]
    output: torch.Tensor

    def __call__(self) -> torch.Tensor:
        for step in self.steps:
            step.run()
        return self.output


class CpuGraphRecorder:
    """``GraphRecorder`` for CPU: a replay runs the recorded steps on the recorded tensors."""

    name = "CPU decode graphs"
    checks_replays = True  # DecodeGraphs compares each replay with an eager forward once
    # (and leaves the steps eager where a forward fails or differs)

    def __init__(self) -> None:
        self.recorded_bytes = 0  # activations the recordings keep, all sizes

    def record(self, forward: Callable[[], torch.Tensor]) -> Tape:
        mode = TapeMode()
        with mode:
            output = forward()
        self.recorded_bytes += mode.recorded_bytes
        return Tape(tuple(mode.steps), output)
