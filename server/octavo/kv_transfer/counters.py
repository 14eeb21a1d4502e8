"""The KV transfer connector's counters, as ``/metrics`` reads them (torch-free: the
server's API process imports them with the engine's statistics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeCounters:
    prompt_tokens_received: int = 0  # prompt tokens whose KV came from a remote prefill
    bytes_received: int = 0
    transfer_seconds: float = 0.0  # summed over transfers (metadata check, read, free)
    transfers: int = 0  # completed
    failures: int = 0  # failed (then recomputed or failed, by the policy)


@dataclass
class PrefillCounters:
    held: int = 0  # prompts whose blocks were kept for a remote decode
    freed_by_reader: int = 0
    expired: int = 0


@dataclass
class TransferStats:
    """The connector's counters for ``/metrics`` (a copy per step)."""

    decode: DecodeCounters
    prefill: PrefillCounters
    leases_held: int
