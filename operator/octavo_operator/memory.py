"""Give memory back to the system after services are deleted.

The operator's memory follows how many services it tracks; once many are deleted, what
they used is free inside the process but stays resident: CPython keeps freed small
objects in arenas that are only returned when entirely empty, and glibc keeps freed heap
pages. The operator image therefore runs with ``PYTHONMALLOC=malloc`` (small objects from
glibc's heap, freeable page by page) and ``MALLOC_ARENA_MAX=2`` (not one heap per busy
thread), and a deletion asks this trimmer to close idle API connections, collect cycles
and ``malloc_trim`` a few seconds later, once for a whole burst of deletions.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)
TRIM_DELAY_SECONDS = 8.0


def _libc_function(symbol: str):
    """A function of the C library by name, or None where it lacks it (musl, macOS, an
    older glibc)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), symbol) if name else None
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0), or nothing where there is no glibc (musl, macOS)."""
    trim = _libc_function("malloc_trim")
    return (lambda: trim(0)) if trim is not None else (lambda: None)


class Trimmer:
    def __init__(self, delay: float = TRIM_DELAY_SECONDS) -> None:
        self.delay = delay
        self.releases: list[Callable[[], None]] = []  # run first: e.g. close idle sockets
        self._trim = _malloc_trim()
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def request(self) -> None:
        """Trim ``delay`` seconds from the first request not yet served."""
        with self._lock:
            if self._timer is None:
                self._timer = threading.Timer(self.delay, self._run)
                self._timer.daemon = True
                self._timer.start()

    def _run(self) -> None:
        with self._lock:
            self._timer = None
        for release in self.releases:
            release()
        gc.collect()
        self._trim()
        logger.debug("memory trimmed after deletions")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@dataclass(frozen=True)
class HeapUsage:
    in_use: int  # bytes of live allocations in glibc's heaps (Python's objects among them)
    free: int  # bytes freed but kept inside the heaps (fragmentation after a burst)


def _mallinfo2() -> Callable[[], HeapUsage | None]:
    """glibc's mallinfo2() (2.33+) as a HeapUsage, or None where it is missing."""
    call = _libc_function("mallinfo2")
    if call is None:
        return lambda: None
    call.restype = _MallInfo2

    def read() -> HeapUsage:
        info = call()
        return HeapUsage(in_use=info.uordblks + info.hblkhd, free=info.fordblks)

    return read


heap_usage = _mallinfo2()
