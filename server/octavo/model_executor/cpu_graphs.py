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

The tensors a recording allocated are moved into one arena that every size shares
(``tape_memory``): allocations whose uses do not overlap share bytes, so the graphs keep
only the largest size's busiest moment (``recorded_bytes``), not every activation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from octavo.model_executor.tape_memory import Lifetime, lifetimes, plan_offsets, rebased

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
# A functional op's arguments that an ``out=`` tensor fixes itself (``_to_copy``'s dtype)
OUT_TENSOR_ARGUMENTS = frozenset({"dtype", "layout", "device", "pin_memory"})


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

    def rebased(self, plan: dict[int, Lifetime], arena: torch.UntypedStorage) -> TapeStep:
        """The step with its planned tensors moved into ``arena``."""
        args, kwargs, outputs = rebased((self.args, self.kwargs, self.outputs), plan, arena)
        return TapeStep(self.op, args, kwargs, outputs)


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


def _aliases_an_input(result, args: tuple) -> bool:
    """Is ``result`` over an argument's memory? A view op may copy instead
    (``contiguous`` of a strided tensor returns a fresh one): that copy is replayed."""
    results = result if isinstance(result, (tuple, list)) else (result,)
    inputs = {
        a.untyped_storage().data_ptr()
        for a in tree_flatten(args)[0]
        if isinstance(a, torch.Tensor) and a.layout == torch.strided
    }
    return all(
        not isinstance(r, torch.Tensor) or r.untyped_storage().data_ptr() in inputs for r in results
    )


def _written(argument) -> bool:
    return argument.alias_info is not None and argument.alias_info.is_write


def _writes_arguments(op: torch._ops.OpOverload) -> bool:
    return any(_written(a) for a in op._schema.arguments)


@functools.cache
def out_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload of a one-result functional ``op`` that writes that result into ``out=``
    and takes the same arguments (less the keyword ones an out tensor fixes: its dtype,
    layout, device): ``index.Tensor_out``, ``_to_copy.out``; None where there is none."""
    if len(op._schema.returns) != 1:
        return None
    packet = op.overloadpacket
    candidates = (getattr(packet, name) for name in packet.overloads())
    return next((c for c in candidates if _same_but_out(op, c)), None)


def _same_but_out(op: torch._ops.OpOverload, candidate: torch._ops.OpOverload) -> bool:
    arguments = candidate._schema.arguments
    if [a.name for a in arguments if _written(a)] != ["out"] or arguments[-1].name != "out":
        return False
    taken = [a.name for a in arguments[:-1]]
    functional = op._schema.arguments
    if [a.name for a in functional if a.name in taken] != taken:
        return False
    implied = [a for a in functional if a.name not in taken]
    return all(a.kwarg_only and a.name in OUT_TENSOR_ARGUMENTS for a in implied)


class TapeMode(TorchDispatchMode):
    """Runs every op as usual and writes down the ones a replay must run again."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[TapeStep] = []
        # what the forward allocated, by address (held, so no address is reused meanwhile)
        self.fresh: dict[int, torch.UntypedStorage] = {}

    def _allocated(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage.nbytes():
            self.fresh[storage.data_ptr()] = storage

    def __torch_dispatch__(self, op, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = op(*args, **kwargs)
        if op in ALLOCATIONS:
            self._allocated(result)
            return result
        if (op.is_view or torch.Tag.inplace_view in op.tags) and _aliases_an_input(result, args):
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
        for fresh in results:
            self._allocated(fresh)
        outputs = tuple(_frozen(r) for r in results)
        return _writing_step(op, args, kwargs, outputs) or TapeStep(op, args, kwargs, outputs)


def _writing_step(op, args: tuple, kwargs: dict, outputs: tuple) -> TapeStep | None:
    """The functional step as its ``out=`` variant writing the recorded output (no fresh
    result and copy a replay), tried once here; None where there is none or it fails."""
    writer = out_variant(op)
    if writer is None:
        return None
    taken = {a.name for a in writer._schema.arguments}
    kept = {name: value for name, value in kwargs.items() if name in taken}
    step = TapeStep(writer, args, {**kept, "out": outputs[0]}, None)
    try:
        step.run()  # writes what the functional op returned into the output again
    except RuntimeError:
        return None
    return step


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
    shares_outputs = True  # a recording's output is planned into the shared arena too

    def __init__(self) -> None:
        self.recorded_bytes = 0  # the arena the recordings keep, all sizes
        self.arena = torch.UntypedStorage(0)  # every recording's activations
        self.arena_generation = 0  # bumped when a recording needs a larger arena

    def record(self, forward: Callable[[], torch.Tensor]) -> Tape:
        mode = TapeMode()
        with mode:
            output = forward()
        with torch.inference_mode(output.is_inference()):
            output, steps = self._planned(mode, output)
        return Tape(steps, output)

    def _planned(
        self, mode: TapeMode, output: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[TapeStep, ...]]:
        """The recording's steps over the shared arena (replaced by a larger one when this
        recording needs more: recorded largest first, it is allocated once; the recordings
        over the old one must be made again). The output lives there to the end of the
        replay, valid until the next replay of any size."""
        steps = mode.steps
        plan = lifetimes([(s.args, s.kwargs, s.outputs) for s in steps], mode.fresh)
        returned = plan.get(output.untyped_storage().data_ptr())
        if returned is not None:
            returned.last = len(steps)
        needed = plan_offsets(plan.values())
        if needed > self.arena.nbytes():
            self.arena = torch.UntypedStorage(needed, device=output.device)
            self.recorded_bytes = needed
            self.arena_generation += 1
        output = rebased(output, plan, self.arena)
        return output, tuple(step.rebased(plan, self.arena) for step in steps)
