"""Leases on a prefill engine's held KV blocks: who may still read them, and until when.

After a prompt prefills for a remote decode, its blocks stay allocated under a lease
that the decode engine must read (or heartbeat) before it expires; expired leases are
handed back to the core loop, which frees their blocks. Every grant gets a generation
number never used before, and every read names it: a read for a request id whose lease
expired and was granted again (the id reused, the blocks now someone else's) never
matches, so a decode engine never reads reused memory (vLLM's NIXL reads can).

The table is shared by the core loop thread (grant, release, take_expired) and the side
channel's threads (check, extend), so one lock guards it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_LEASE_SECONDS = 30.0  # vLLM's ``kv_lease_duration``


class LeaseExpired(Exception):
    """The blocks are gone (expired, released) or were never granted under that generation."""


class PromptMismatch(LeaseExpired):
    """A read named a lease whose blocks hold another prompt (its digest differs): for the
    reader they are as good as gone, so it recomputes its prompt or fails by its policy."""


@dataclass
class Lease:
    request_id: str  # the prefill engine's request id (``remote_request_id``)
    block_ids: list[int]  # the prefill engine's block ids, in prompt order
    num_tokens: int  # prompt tokens those blocks hold (the last block may be partial)
    expires_at: float  # on the table's clock (``time.monotonic`` by default)
    generation: int  # unique per grant, never reused
    prompt_digest: str = ""  # what the blocks hold (``prompt_digest.prompt_digest``)


class LeaseTable:
    """The held blocks of every request waiting for its decode engine (thread-safe)."""

    def __init__(
        self, duration: float = DEFAULT_LEASE_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if duration <= 0:
            raise ValueError(f"a lease lasts a positive number of seconds, got {duration}")
        self.duration, self.clock = duration, clock
        self._leases: dict[str, Lease] = {}
        self._generations = itertools.count(1)
        self._lock = threading.Lock()

    def grant(
        self, request_id: str, block_ids: list[int], num_tokens: int, prompt_digest: str = ""
    ) -> Lease:
        """Hold ``block_ids`` for ``request_id`` for one lease duration (a request id
        already held is an error: its blocks would leak); ``prompt_digest`` names what they
        hold, and every read must name the same."""
        with self._lock:
            if request_id in self._leases:
                raise ValueError(f"request {request_id!r} already holds a lease")
            lease = Lease(
                request_id,
                list(block_ids),
                num_tokens,
                self.clock() + self.duration,
                next(self._generations),
                prompt_digest,
            )
            self._leases[request_id] = lease
            return lease

    def check(self, request_id: str, generation: int) -> Lease:
        """The live lease of ``request_id`` under ``generation``; ``LeaseExpired`` if it is
        missing, expired or of another generation."""
        with self._lock:
            return self._live(request_id, generation)

    def extend(self, request_id: str, generation: int) -> None:
        """A heartbeat: the lease lasts at least two thirds of a duration from now."""
        with self._lock:
            lease = self._live(request_id, generation)
            lease.expires_at = max(lease.expires_at, self.clock() + self.duration * 2 / 3)

    def release(self, request_id: str) -> Lease | None:
        """Drop the lease now (read, or aborted); the lease, or None if there was none."""
        with self._lock:
            return self._leases.pop(request_id, None)

    def take_expired(self) -> list[Lease]:
        """Remove and return every expired lease (the core loop frees their blocks)."""
        with self._lock:
            now = self.clock()
            expired = [lease for lease in self._leases.values() if lease.expires_at <= now]
            for lease in expired:
                del self._leases[lease.request_id]
            return expired

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def _live(self, request_id: str, generation: int) -> Lease:
        lease = self._leases.get(request_id)
        if lease is None or lease.generation != generation:
            raise LeaseExpired(f"no lease for request {request_id!r} generation {generation}")
        if lease.expires_at <= self.clock():
            raise LeaseExpired(f"the lease of request {request_id!r} expired")
        return lease
