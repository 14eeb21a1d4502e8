"""Run at start-up by every python whose ``PYTHONPATH`` starts with this folder (the
benchmarks' vLLM processes, when ``ATEN_CPU_CAPABILITY`` holds torch below AVX-512): torch's
AVX-512 probes answer no, so vLLM loads ``_C_AVX2`` and picks its AVX2 attention, as on an
AVX2-only CPU. Does nothing when torch is not held below AVX-512."""

import os

if os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() in ("avx2", "default"):
    import torch.cpu

    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
    torch.cpu._is_amx_tile_supported = lambda: False
