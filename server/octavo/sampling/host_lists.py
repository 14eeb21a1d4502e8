"""Small per-step tensors built on the host (row indices, per-row settings, token ids)
and sent to the logits' device without making the host wait for that device.

A copy from ordinary (pageable) host memory to a CUDA tensor synchronises the stream:
the host would wait for the decode step still running on the GPU. Staged in pinned
memory, the copy is queued like a kernel (PyTorch's pinned-memory allocator keeps the
buffer alive until the copy has run), so the sampler's only wait is its one transfer of
the results back (``Sampler``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def device_tensor(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``values`` as a 1-D ``dtype`` tensor on ``device``, queued without a host wait."""
    if device.type != "cuda":
        return torch.tensor(list(values), dtype=dtype, device=device)
    staged = torch.tensor(list(values), dtype=dtype, pin_memory=True)  # pinned from the start
    return staged.to(device, non_blocking=True)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The CPU tensor ``host`` on ``device``; a CUDA copy goes through pinned memory."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
