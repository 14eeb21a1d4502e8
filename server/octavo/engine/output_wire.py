"""A step's request outputs as plain tuples for the pipe between the core and the server.

Pickle writes a dataclass as its class and a dict of its fields, object by object: a step
of 256 streaming requests (a ``RequestOutput``, a ``CompletionOutput`` and a
``RequestMetrics`` each) took 1.5-2 ms to pickle in the engine core's loop, every step,
and as long to read back. As tuples of their fields, read in C by ``attrgetter``, the
same step pickles in a fraction of that; the server rebuilds the dataclasses. Each is
packed as a list, so that outputs of other kinds travel as they are: pooling ones, and
token deltas (tuples, ``token_deltas.py``), which the server expands itself.
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Any

from octavo.outputs import CompletionOutput, RequestMetrics, RequestOutput

NESTED = ("outputs", "metrics")  # packed on their own
REQUEST_FIELDS = tuple(f.name for f in fields(RequestOutput) if f.name not in NESTED)
COMPLETION_FIELDS = tuple(f.name for f in fields(CompletionOutput))
METRICS_FIELDS = tuple(f.name for f in fields(RequestMetrics))
_request_values = attrgetter(*REQUEST_FIELDS)
_completion_values = attrgetter(*COMPLETION_FIELDS)
_metrics_values = attrgetter(*METRICS_FIELDS)


def pack_outputs(outputs: list[Any]) -> list[Any]:
    """Each ``RequestOutput`` as ``[fields, completions' fields, metrics' fields]``."""
    return [_pack(output) if type(output) is RequestOutput else output for output in outputs]


def unpack_outputs(packed: list[Any]) -> list[Any]:
    """The outputs ``pack_outputs`` packed, equal to the originals."""
    return [_unpack(item) if type(item) is list else item for item in packed]


def _pack(output: RequestOutput) -> list:
    completions = [_completion_values(completion) for completion in output.outputs]
    return [_request_values(output), completions, _metrics_values(output.metrics)]


def _unpack(item: list) -> RequestOutput:
    values, completions, metrics = item
    output = _plain(RequestOutput, REQUEST_FIELDS, values)
    output.outputs = [_plain(CompletionOutput, COMPLETION_FIELDS, c) for c in completions]
    output.metrics = _plain(RequestMetrics, METRICS_FIELDS, metrics)
    return output


def _plain(cls: type, names: tuple[str, ...], values: tuple) -> Any:
    """An instance of a plain dataclass (no ``__post_init__``) from its field values, as
    pickle itself rebuilds one: ``__dict__`` set without running ``__init__``."""
    instance = object.__new__(cls)
    instance.__dict__.update(zip(names, values, strict=True))
    return instance
