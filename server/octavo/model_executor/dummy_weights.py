"""``--load-format dummy`` (vLLM's name): random weights instead of the checkpoint's.

A folder needs only its config.json and a tokenizer; no safetensors file is read. As
vLLM's dummy loader, every floating-point parameter is drawn uniformly from a small range
with a fixed seed, on the parameter's own device (no host copy of a large model).
Throughput does not depend on what the weights say, so benchmarks can run a large
model's shape without writing or reading its checkpoint. The formats themselves, and the
check of a format against a quantization, are in ``load_formats.py`` (no torch).
"""

from __future__ import annotations

import torch
from torch import nn

DUMMY_LOW, DUMMY_HIGH, DUMMY_SEED = -1e-3, 1e-3, 1234  # vLLM's initialize_dummy_weights


def fill_dummy_weights(model: nn.Module, seed: int = DUMMY_SEED) -> int:
    """Every floating-point parameter of ``model`` drawn from U(DUMMY_LOW, DUMMY_HIGH), in
    place on its device; returns how many parameters were filled. Shared storage (a tied
    LM head) is filled once."""
    generators: dict[torch.device, torch.Generator] = {}
    filled = 0
    for parameter in model.parameters():  # parameters() yields a shared one once
        if not torch.is_floating_point(parameter):
            continue
        device = parameter.device
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        _fill_uniform(parameter.data, generators[device])
        filled += 1
    return filled


def _fill_uniform(tensor: torch.Tensor, generator: torch.Generator) -> None:
    """U(low, high) in place; 8-bit floats have no uniform_, so draw in bf16 and copy."""
    if tensor.element_size() >= 2:
        tensor.uniform_(DUMMY_LOW, DUMMY_HIGH, generator=generator)
        return
    draw = torch.empty(tensor.shape, dtype=torch.bfloat16, device=tensor.device)
    tensor.copy_(draw.uniform_(DUMMY_LOW, DUMMY_HIGH, generator=generator))
