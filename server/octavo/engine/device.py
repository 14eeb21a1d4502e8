"""Choosing the device and the compute dtype."""

from __future__ import annotations

import torch

from octavo.kernels.cpu_features import cpu_has_native_bf16, onednn_supports_bf16

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def select_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA GPU is available")
    return device


def select_dtype(requested: str, device: torch.device) -> torch.dtype:
    """bf16 on GPUs and on CPUs with native bf16 (AVX-512-BF16 or AMX) that torch's oneDNN
    also runs bf16 on, else fp32."""
    if requested != "auto":
        return _DTYPES[requested]
    if device.type == "cuda" or (cpu_has_native_bf16() and onednn_supports_bf16()):
        return torch.bfloat16
    return torch.float32
