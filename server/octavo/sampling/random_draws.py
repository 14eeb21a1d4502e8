"""Random draws for sampling, from a request's own generator or the global RNG.

The device rule: a ``torch.Generator`` can only fill tensors on its own device (CUDA
refuses a CPU generator for a CUDA tensor; CPU kernels do not check). Every draw that
uses a generator therefore happens on ``generator.device`` and the numbers are then
moved to where the logits live — a no-op when the runner made the generator there
(``generator_for``), one small copy per draw otherwise. Every random number the samplers
use comes from this module, so the rule holds in one place.
"""

from __future__ import annotations

import torch

ACCELERATOR_TYPES = frozenset({"cuda", "xpu", "mps"})  # devices with generators of their own


def generator_for(seed: int, device: torch.device) -> torch.Generator:
    """A generator seeded with ``seed`` on ``device`` if that device has generators of its
    own, else on the CPU (the draws are then moved; see the module doc)."""
    where = device if device.type in ACCELERATOR_TYPES else torch.device("cpu")
    return torch.Generator(device=where).manual_seed(seed)


def uniform(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """``Uniform[0, 1)`` float32 numbers of ``shape`` on ``device``."""
    if generator is None:
        return torch.rand(shape, device=device)
    values = torch.rand(shape, generator=generator, device=generator.device)
    return values.to(device)


def exponential_noise(like: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """``Exp(1)`` noise shaped like ``like [rows, vocab]``, as ``-log(U)``: row ``i`` from
    ``generators[i]`` (``None``: the global RNG, one draw for all such rows).
    (``-log(rand)`` is several times faster than ``Tensor.exponential_`` on CPU.)"""
    noise = torch.empty(like.shape, dtype=torch.float32, device=like.device)
    if any(g is None for g in generators):
        noise.uniform_()  # seeded rows are overwritten below
    for i, generator in enumerate(generators):
        if generator is None:
            continue
        if generator.device == like.device:
            noise[i].uniform_(generator=generator)  # in place: no per-row copy
        else:
            noise[i] = uniform((like.shape[1],), generator, like.device)
    return noise.log_().neg_()


def row_uniforms(generators: list[torch.Generator | None]) -> torch.Tensor:
    """One ``U[0, 1)`` float64 number per row on the CPU: row ``i`` from ``generators[i]``
    (drawn on its device), rows without one from the global RNG in one draw."""
    values = [0.0] * len(generators)
    unseeded = [i for i, generator in enumerate(generators) if generator is None]
    drawn = torch.rand(len(unseeded), dtype=torch.float64).tolist() if unseeded else []
    for i, value in zip(unseeded, drawn, strict=True):
        values[i] = value
    for i, generator in enumerate(generators):
        if generator is not None:
            draw = torch.rand(1, dtype=torch.float64, generator=generator, device=generator.device)
            values[i] = draw.item()
    return torch.tensor(values, dtype=torch.float64)


def race(weights: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One index per row of non-negative ``weights [rows, vocab]`` (unnormalised), drawn
    with probability proportional to its weight: the "exponential race"
    ``argmax(weights / E)``, ``E ~ Exp(1)``. A tensor on ``weights``' device."""
    scores = exponential_noise(weights, generators).reciprocal_().mul_(weights)  # no copy
    return scores.max(dim=-1).indices
