"""An explicit bf16 on a CPU without AVX-512/AVX-NE-CONVERT loads unpacked, never crashes.

oneDNN's prepacked bf16 linears refuse such CPUs at load ("bf16 path needs the cpu
support avx_ne_convert or avx512bw, avx512vl and avx512dq"); seen on an AVX2-only AMD
EPYC. The CPU's flags are faked here, so the test runs on any machine.
"""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.kernels import cpu_features
from octavo.model_executor.layers.linear import LinearBase

AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma"})
SAPPHIRE_RAPIDS = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_bf16"}


def packed_layers(llm: LLM) -> int:
    model = llm.engine.executor.worker.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    return sum(m.packed_weight is not None for m in linears)


@pytest.mark.parametrize(("flags", "packs"), [(AVX2_ONLY, False), (SAPPHIRE_RAPIDS, True)])
def test_bf16_loads_and_generates_on_any_cpu(tiny_folder, monkeypatch, flags, packs):
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: flags)
    llm = LLM(str(tiny_folder("llama3")), dtype="bfloat16", max_model_len=64,
              kv_cache_memory=1 << 20)  # fmt: skip
    assert (packed_layers(llm) > 0) is packs
    (out,) = llm.generate([11, 12, 13], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4


def test_auto_picks_bf16_only_with_bf16_hardware(monkeypatch):
    import torch

    from octavo.engine.device import select_dtype

    cpu = torch.device("cpu")
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: AVX2_ONLY)
    assert select_dtype("auto", cpu) == torch.float32
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: SAPPHIRE_RAPIDS)
    assert select_dtype("auto", cpu) == torch.bfloat16
