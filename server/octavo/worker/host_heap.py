"""A CPU worker's heap keeps the memory a step frees for the next step.

glibc serves an allocation above its mmap threshold (adjusted as the process frees, 32 MiB
at most) from a fresh mapping and unmaps it when it is freed, so a tensor that large is
faulted in page by page every time it is made. A decode step of 256 rows over SmolLM2's
49,152-token vocabulary makes 50 MB of logits: 11,900 page faults a step, then an
unmapping, ~20 ms of a 75 ms step of a tiny model on the AVX2-only AMD EPYC (a 50 MB
tensor made and filled takes 20 ms there, an old one filled 2 ms). Larger vocabularies
pass 32 MiB at fewer rows (Llama 3's 128,256 tokens from 66 rows), and so do the MLP
activations of a 512-token prefill chunk of an 8B model. vLLM's CPU build preloads
tcmalloc into its workers for the same reason.

Once a worker has loaded its weights, allocated its KV cache and captured its graphs,
``KeptHeap.hold`` hands start-up's freed memory back (``malloc_trim``), then stops glibc
from mapping (``M_MMAP_MAX`` 0: every allocation comes from the heap, and freed chunks are
reused) and lets at most ``TRIM_THRESHOLD`` lie free at the heap's top (a larger spike
there is still returned). ``release`` (the engine's shutdown) maps large allocations
again, above 32 MiB as the adjusted threshold did, and trims. Several engines in one
process share one hold. Without glibc (musl, macOS) nothing changes;
``OCTAVO_CPU_KEEP_FREED_MEMORY=0`` leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

SWITCH_ENV = "OCTAVO_CPU_KEEP_FREED_MEMORY"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # <malloc.h>
TRIM_THRESHOLD = 512 << 20  # free bytes at the heap's top kept while held
DEFAULT_MMAP_MAX = 65536  # glibc's
RELEASED_MMAP_THRESHOLD = 32 << 20  # the most glibc's adjusted threshold reaches
RELEASED_TRIM_THRESHOLD = 2 * RELEASED_MMAP_THRESHOLD  # glibc adjusts it to twice that


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """This process's C library where it is glibc (it has ``mallopt`` and ``malloc_trim``)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None
    return libc


@dataclass
class KeptHeap:
    """The process's hold on glibc's heap (``HOST_HEAP``: one per process)."""

    holders: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self) -> bool:
        """Keep freed memory in the heap from now on; True where this process now does."""
        if os.environ.get(SWITCH_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            return False
        libc = _glibc()
        if libc is None:
            return False
        with self._lock:
            self.holders += 1
            if self.holders == 1:
                libc.malloc_trim(0)
                _set(libc, {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: TRIM_THRESHOLD})
                logger.info("freed memory stays in the heap for the next steps (mmap off)")
        return True

    def release(self) -> None:
        """One holder is done; the last one gives glibc back its mappings and trims."""
        libc = _glibc()
        if libc is None:
            return
        with self._lock:
            if self.holders == 0:
                return
            self.holders -= 1
            if self.holders == 0:
                _set(
                    libc,
                    {
                        M_MMAP_MAX: DEFAULT_MMAP_MAX,
                        M_MMAP_THRESHOLD: RELEASED_MMAP_THRESHOLD,
                        M_TRIM_THRESHOLD: RELEASED_TRIM_THRESHOLD,
                    },
                )
                libc.malloc_trim(0)


def _set(libc: ctypes.CDLL, settings: dict[int, int]) -> None:
    for parameter, value in settings.items():
        if libc.mallopt(parameter, value) != 1:
            logger.warning("mallopt(%d, %d) was refused", parameter, value)


HOST_HEAP = KeptHeap()
