"""bf16 on any CPU: on the native panel kernel (where it loads and the CPU has no AMX), else
prepacked where torch's oneDNN says it can, unpacked elsewhere, never a crash.

oneDNN's prepacked bf16 linears refuse CPUs without AVX-NE-CONVERT or AVX-512 BW/VL/DQ at
load ("bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and
avx512dq"; seen on an AVX2-only AMD EPYC). The decision comes from torch's own report,
not from /proc/cpuinfo: a CPU whose flags promise AVX-512 while oneDNN is limited
(``ONEDNN_MAX_CPU_ISA=AVX2``) must not pack either. The tests never fake a capability and
then call the real oneDNN op: the host's ISA runs as it is, and the AVX2 case is forced
explicitly in a child process (with the panel kernel off, ``OCTAVO_CPU_DENSE=0``), so each
machine kind runs every branch it can.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.kernels import cpu_features
from octavo.model_executor.layers import linear_method
from octavo.model_executor.layers.dense_linear import dense_ops, is_dense
from octavo.model_executor.layers.linear import LinearBase

AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma"})
SAPPHIRE_RAPIDS = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_bf16"}
CPU = torch.device("cpu")

# Loads the tiny model in bf16 in a fresh process and reports how many linears packed.
CHILD = """
import json, sys
from octavo import LLM, SamplingParams
from octavo.kernels.cpu_features import onednn_supports_bf16
from octavo.model_executor.layers.linear import LinearBase
llm = LLM(sys.argv[1], dtype="bfloat16", max_model_len=64, kv_cache_memory=1 << 20)
model = llm.engine.executor.worker.model
packed = sum(m.packed_weight is not None for m in model.modules() if isinstance(m, LinearBase))
(out,) = llm.generate([11, 12, 13], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
print(json.dumps({"supported": onednn_supports_bf16(), "packed": packed,
                  "tokens": len(out.outputs[0].token_ids)}))
"""


def packed_weights(llm: LLM) -> list[torch.Tensor]:
    model = llm.engine.executor.worker.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    return [m.packed_weight for m in linears if m.packed_weight is not None]


@pytest.mark.parametrize("dense", ["1", "0"], ids=["panel-kernel", "onednn"])
def test_bf16_packs_where_a_kernel_runs_it(tiny_folder, monkeypatch, dense):
    """The host as it is: every linear on the panel kernel where it runs bf16 here; with it
    off (``OCTAVO_CPU_DENSE=0``), packed for oneDNN iff torch reports oneDNN bf16 support.
    Generates either way."""
    monkeypatch.setenv(cpu_features.DENSE_ENV, dense)
    llm = LLM(
        str(tiny_folder("llama3")), dtype="bfloat16", max_model_len=64, kv_cache_memory=1 << 20
    )
    packed = packed_weights(llm)
    if dense_ops(torch.bfloat16, CPU) is not None:
        assert packed and all(is_dense(weight) for weight in packed)
    else:
        assert (len(packed) > 0) is cpu_features.onednn_supports_bf16()
        assert not any(is_dense(weight) for weight in packed)
    (out,) = llm.generate([11, 12, 13], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4


def test_bf16_unpacked_when_onednn_is_limited_to_avx2(tiny_folder):
    """Forced AVX2 (as on an AMD EPYC without AVX-512) and the panel kernel off: torch says
    no, nothing packs, and the model still loads and generates, whatever this host's own
    CPU can do."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", cpu_features.DENSE_ENV: "0"}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_folder("llama3"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"supported": False, "packed": 0, "tokens": 4}


@pytest.mark.parametrize("flags", [AVX2_ONLY, SAPPHIRE_RAPIDS])
@pytest.mark.parametrize("torch_says", [False, True])
def test_pack_decision_follows_torch_not_cpuinfo(monkeypatch, flags, torch_says):
    """/proc/cpuinfo may promise AVX-512 while oneDNN refuses (and the reverse): the
    decision follows torch. Only the decision is checked here, no real op is called."""
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: flags)
    monkeypatch.setattr(linear_method, "onednn_supports_bf16", lambda: torch_says)
    assert linear_method.can_pack(torch.bfloat16, CPU) is torch_says
    assert linear_method.can_pack(torch.float32, CPU) is torch.backends.mkldnn.is_available()


def test_auto_picks_bf16_only_with_bf16_hardware_that_onednn_runs(monkeypatch):
    from octavo.engine import device

    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: AVX2_ONLY)
    monkeypatch.setattr(device, "onednn_supports_bf16", lambda: True)
    assert device.select_dtype("auto", CPU) == torch.float32
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: SAPPHIRE_RAPIDS)
    assert device.select_dtype("auto", CPU) == torch.bfloat16
    monkeypatch.setattr(device, "onednn_supports_bf16", lambda: False)  # ONEDNN_MAX_CPU_ISA
    assert device.select_dtype("auto", CPU) == torch.float32
