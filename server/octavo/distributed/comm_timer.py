"""Time spent in communication, per kind (all-reduce, gather, pipeline receive), per process.

The collectives wrap themselves in ``timed(kind)``; a worker hands the totals to whoever
asks (``take_communication_stats``), e.g. the parallel benchmark, which prints the
communication cost per step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

_SECONDS: defaultdict[str, float] = defaultdict(float)
_CALLS: defaultdict[str, int] = defaultdict(int)


@contextmanager
def timed(kind: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        _SECONDS[kind] += time.perf_counter() - start
        _CALLS[kind] += 1


def take_communication_stats() -> dict[str, tuple[float, int]]:
    """``{kind: (seconds, calls)}`` since the last call, then start again from zero."""
    stats = {kind: (_SECONDS[kind], _CALLS[kind]) for kind in _SECONDS}
    _SECONDS.clear()
    _CALLS.clear()
    return stats
