"""A step's sampled ids on their way to the host (async scheduling's one read-back).

``read_back`` queues the copy of the ids (and any packed logprobs) into pinned host
memory and records an event; the ids stay on the device meanwhile, where the next step's
inputs take them without a round trip. ``result()`` waits for that copy only, so the host
can prepare the next step while the device still samples this one. Off CUDA the copy is
immediate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PendingSample:
    token_ids: torch.Tensor | None  # [rows] int64 on the device; None: nothing sampled
    host: torch.Tensor | None  # where the transfer lands (pinned on CUDA)
    copied: torch.cuda.Event | None  # recorded after the transfer (CUDA only)
    finish: Callable[[torch.Tensor | None], Any]  # host values -> the SampleResult

    @classmethod
    def known(cls, result: Any) -> PendingSample:
        """An already known result (an empty batch)."""
        return cls(None, None, None, lambda _host: result)

    def result(self) -> Any:
        """The sampled tokens (and logprobs) on the host; waits for the transfer alone."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.finish(self.host)


def read_back(
    token_ids: torch.Tensor,
    extra: torch.Tensor | None,
    finish: Callable[[torch.Tensor | None], Any],
) -> PendingSample:
    """Queue the transfer of ``token_ids`` (followed by ``extra``, same dtype) to the host."""
    payload = token_ids if extra is None else torch.cat([token_ids, extra])
    if payload.device.type != "cuda":
        return PendingSample(token_ids, payload.cpu(), None, finish)
    host = torch.empty(payload.shape, dtype=payload.dtype, pin_memory=True)
    host.copy_(payload, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return PendingSample(token_ids, host, event, finish)
