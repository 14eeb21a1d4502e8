"""Records Triton kernel launches (without running them) and tells which compiled variant
each launch would take: Triton compiles a kernel again for every new specialisation of its
arguments (an integer equal to 1 or divisible by 16, a pointer aligned to 16 bytes), unless
the kernel declares the argument ``do_not_specialize`` / ``do_not_specialize_on_alignment``.
Works under ``TRITON_INTERPRET=1`` and on a GPU alike (Triton's own specialisation code)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field

from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


@dataclass(frozen=True)
class Launch:
    kernel: object  # a JITFunction, or an InterpretedFunction under the interpreter
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def compile_options(self) -> tuple:
        """The constexpr arguments and launch options: each value is its own variant."""
        bound, signature = self._bound()
        constexprs = [(n, bound[n]) for n in signature.parameters if _is_constexpr(signature, n)]
        options = [(n, v) for n, v in self.kwargs.items() if n not in signature.parameters]
        return (self.name, tuple(constexprs), tuple(sorted(options)))

    def specialization(self, declared: bool = True) -> tuple:
        """How Triton specialises each other argument; ``declared=False``: as if the kernel
        declared nothing unspecialised (what it would be without its declarations)."""
        bound, signature = self._bound()
        never = unspecialized(self.kernel, "do_not_specialize") if declared else set()
        unaligned = (
            unspecialized(self.kernel, "do_not_specialize_on_alignment") if declared else set()
        )
        key = []
        for name in signature.parameters:
            value = bound[name]
            if _is_constexpr(signature, name) or value is None or isinstance(value, float):
                continue
            spec = native_specialize_impl(
                BaseBackend, value, False, name not in never, name not in unaligned
            )
            key.append((name, spec))
        return tuple(key)

    def _bound(self) -> tuple[dict, inspect.Signature]:
        signature = inspect.signature(self.kernel.fn)
        known = {n: v for n, v in self.kwargs.items() if n in signature.parameters}
        arguments = signature.bind_partial(*self.args, **known)
        arguments.apply_defaults()
        return dict(arguments.arguments), signature


def unspecialized(kernel: object, kind: str) -> set[str]:
    """The argument names a kernel declares ``kind`` (``do_not_specialize`` or
    ``do_not_specialize_on_alignment``)."""
    values = getattr(kernel, kind, None)
    if values is None:  # the interpreter keeps the decorator's arguments as they came
        values = getattr(kernel, "kwargs", {}).get(kind)
    return set(values or ())


def _is_constexpr(signature: inspect.Signature, name: str) -> bool:
    return "constexpr" in str(signature.parameters[name].annotation)


@dataclass
class LaunchRecorder:
    launches: list[Launch] = field(default_factory=list)

    def variants(self, declared: bool = True) -> dict[tuple, set[tuple]]:
        """Per kernel and compile options: the distinct specialisations launched."""
        found: dict[tuple, set[tuple]] = {}
        for launch in self.launches:
            key = launch.compile_options()
            found.setdefault(key, set()).add(launch.specialization(declared))
        return found


@contextlib.contextmanager
def recorded_launches(monkeypatch) -> Iterator[LaunchRecorder]:
    """Every kernel launch in the block is recorded, not run (outputs stay unwritten)."""
    recorder = LaunchRecorder()

    def record(kernel, *args, grid, warmup, **kwargs):
        recorder.launches.append(Launch(kernel, args, kwargs))

    monkeypatch.setattr(JITFunction, "run", record)
    monkeypatch.setattr(InterpretedFunction, "run", record)
    yield recorder
