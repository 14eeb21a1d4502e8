"""Holds vLLM's CPU build to the ISA that torch is held to (see ``sitecustomize.py``).

vLLM's x86 wheel carries three kernel libraries (``_C`` for AVX-512 + bf16, ``_C_AVX512``,
``_C_AVX2``) and picks one by asking ``torch.cpu._is_avx512_supported()`` and
``_is_avx512_bf16_supported()``, which read the hardware: ``ATEN_CPU_CAPABILITY=avx2`` holds
torch's own kernels to AVX2 but leaves vLLM's library (its attention, its activations) on
AVX-512. The benchmarks put this folder first on the vLLM processes' ``PYTHONPATH`` so the
``sitecustomize`` here answers those probes as an AVX2-only CPU would, and the AVX2 stand-in
holds both engines to AVX2.
"""

from __future__ import annotations

import os
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
# torch's capability names below AVX-512 (``default`` is plain x86-64)
BELOW_AVX512 = ("avx2", "default")


def held_below_avx512(env: dict[str, str] | os._Environ) -> bool:
    """Whether ``env`` holds torch below AVX-512 (``ATEN_CPU_CAPABILITY``)."""
    return env.get("ATEN_CPU_CAPABILITY", "").strip().lower() in BELOW_AVX512
