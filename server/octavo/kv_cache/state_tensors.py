"""The state layers' tensors on a worker, beside the attention layers' KV cache.

A state layer's cache is a tuple of tensors ``(num_slots, *shape)`` (``StateSpec``); the
per-layer cache list holds the KV tensor of each attention layer and that tuple for each
state layer, in layer order. Slot 0, the null slot, takes writes of sequences without a
slot of their own (the memory profile's dummy step).
"""

from __future__ import annotations

import torch

from octavo.kv_cache.state_slots import StateSpec

LayerCache = torch.Tensor | tuple[torch.Tensor, ...]  # attention: KV tensor; state: its tensors


def allocate_state(
    spec: StateSpec, num_slots: int, model_dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """One state layer's tensors, ``(num_slots, *shape)`` each, zeroed."""
    dtype = spec.dtype or model_dtype
    return tuple(
        torch.zeros((num_slots, *shape), dtype=dtype, device=device) for shape in spec.shapes
    )


def layer_caches(
    kv_caches: list[torch.Tensor],
    specs: list[StateSpec | None],
    num_slots: int,
    model_dtype: torch.dtype,
    device: torch.device,
) -> list[LayerCache]:
    """Every layer's cache in layer order: the next KV tensor for an attention layer
    (``None`` spec), freshly allocated state tensors for a state layer."""
    kv = iter(kv_caches)
    caches: list[LayerCache] = []
    for spec in specs:
        caches.append(
            next(kv) if spec is None else allocate_state(spec, num_slots, model_dtype, device)
        )
    return caches


def state_bytes(specs: list[StateSpec | None], num_slots: int, model_dtype: torch.dtype) -> int:
    """What the state layers' tensors take (the KV budget pays for them first)."""
    return num_slots * sum(spec.bytes_per_slot(model_dtype) for spec in specs if spec is not None)


def has_state_caches(caches: list[LayerCache]) -> bool:
    return any(isinstance(cache, tuple) for cache in caches)


def copy_states(caches: list[LayerCache], copies: list[tuple[int, int]]) -> None:
    """Forks: each destination slot takes its source slot's state, in every state layer."""
    if not copies:
        return
    states = [cache for cache in caches if isinstance(cache, tuple)]
    if not states:
        return
    device = states[0][0].device
    sources = torch.tensor([src for src, _ in copies], device=device)
    targets = torch.tensor([dst for _, dst in copies], device=device)
    for state in states:
        for tensor in state:
            tensor[targets] = tensor[sources]
