"""How many bytes a CPU worker gives its KV cache: ``--kv-cache-memory`` (2 GiB by
default), refused at start when it, the weights and the steps' activations cannot fit in
the host's memory.

The weights count as stored (``model_executor.footprint``): quantized blocks and
oneDNN-prepacked layouts, a tied LM head's packed copy of the embedding table included
(SmolLM2 in fp32: 513.1 → 621.1 MiB; a Gemma-2-2B-sized head in fp32: +2.2 GiB). The
host's memory is its cgroup limit (a pod's ``resources.limits.memory``) or, without one,
its physical memory: a cache that cannot fit is refused with a line instead of the
kernel's OOM killer ending the server once the cache fills. The activations are estimated
from the largest step's shapes (``gpu_budget.activation_bytes``: its tokens, logits rows
and sampled rows) plus the CPU decode graphs' arena (the largest captured batch's forward).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_V2_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")
CGROUP_V1_MEMORY_LIMIT = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")


@dataclass(frozen=True)
class HostMemory:
    """The most memory this process may use, and where the figure comes from."""

    limit: int
    source: str  # "cgroup memory limit" or "physical memory"

    @classmethod
    def read(cls) -> HostMemory | None:
        """The cgroup's limit when it is below the physical memory; None when unknown."""
        physical = _physical_memory()
        cgroup = cgroup_memory_limit()
        if cgroup is not None and (physical is None or cgroup < physical):
            return cls(cgroup, "cgroup memory limit")
        return None if physical is None else cls(physical, "physical memory")


def cgroup_memory_limit() -> int | None:
    """The cgroup's memory limit in bytes (v2, else v1); None when unlimited or unknown."""
    for path in (CGROUP_V2_MEMORY_MAX, CGROUP_V1_MEMORY_LIMIT):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        return int(text) if text.isdigit() else None  # v2 writes "max" when unlimited
    return None


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class HostNeeds:
    """What a CPU worker holds besides its KV cache, in bytes."""

    weights: int  # as stored
    copies: int  # of them, prepacked copies (a tied LM head's)
    activations: int = 0  # the largest step's, and the CPU decode graphs' arena

    @property
    def total(self) -> int:
        return self.weights + self.activations


def cpu_kv_bytes(kv_bytes: int, needs: HostNeeds, host: HostMemory | None) -> int:
    """``kv_bytes``, refused (ValueError) when it and the worker's other ``needs`` exceed
    ``host.limit``."""
    if host is None or needs.total + kv_bytes <= host.limit:
        return kv_bytes
    room = max(0, host.limit - needs.total)
    raise ValueError(
        f"--kv-cache-memory {_gib(kv_bytes)} does not fit in this host's memory: its "
        f"{host.source} is {_gib(host.limit)}, the weights take {_gib(needs.weights)} "
        f"(incl. {_gib(needs.copies)} of prepacked copies) and the steps' activations "
        f"{_gib(needs.activations)} (the largest step's, and the decode graphs'), leaving "
        f"{_gib(room)}; lower --kv-cache-memory, --max-num-batched-tokens or "
        "--max-num-seqs, raise the memory limit, or set OCTAVO_CPU_PREPACK=0 to keep the "
        "weights unpacked"
    )


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
