"""Every Triton kernel of the engine compiles for the GPUs users deploy on, and fits their
shared memory: ``triton_gpu_compile.py`` compiles each GPU launch to a cubin without a GPU,
in a child process (the suite runs the kernels under ``TRITON_INTERPRET``, which compiles
nothing). Compiled kernels are cached under Octavo's cache folder, so a run after the
first only loads them.

What this caught before any GPU ran them: the fp8 weight kernels did not compile for an
A100 (sm_80 has no e4m3 type in Triton), and the split decode kernel asked for 139 KiB of
shared memory in blocks of 128 tokens and 144 KiB for Gemma's 256-dim heads: an L4, L40S
or A10 has 99 KiB.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

from octavo.cache_dirs import cache_root

HERE = Path(__file__).parent
SCRIPT = HERE / "triton_gpu_compile.py"
# H100/H200: every kernel, in each dtype and code path. L4/L40S (sm_89: as little shared
# memory as sm_86's A10) and A100: the cases whose compile or shared memory depends on the GPU
# (the large tiles take 4-10 s each to compile: each is compiled for one target only).
ON_H100 = [
    "attention bf16",
    "attention bf16, fp8 cache, every option",
    "attention fp32",
    "norm, rotary, activation bf16",
    "quantized linears bf16",
    "lora bf16",
    "mixture of experts bf16",
    "top-p thresholds",
]
TARGETS = [
    *(f"90={case}" for case in ON_H100),
    "89=attention bf16, blocks of 128",
    "89=attention bf16, blocks of 256",
    "89=split decode, head_dim 256",
    "80=quantized linears bf16",
    "80=split decode, head_dim 256, blocks of 128",
]
KERNEL_MODULES = (
    "octavo.attention.triton_kernels",
    "octavo.attention.triton_decode",
    "octavo.model_executor.triton_rotary",
    "octavo.model_executor.layers.lora_kernels",
    "octavo.model_executor.layers.triton_activation",
    "octavo.model_executor.layers.triton_norm",
    "octavo.model_executor.layers.moe.triton_fused_moe",
    "octavo.model_executor.layers.quantization.triton_fp8_blocks",
    "octavo.model_executor.layers.quantization.triton_kernels",
    "octavo.sampling.top_p_triton",
)


def compile_for(targets: list[str]) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    env["TRITON_CACHE_DIR"] = str(cache_root() / "triton-gpu-compile")
    command = [sys.executable, str(SCRIPT), *targets]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def launched_kernels() -> set[str]:
    """The kernels the engine launches: every ``@triton.jit`` function named ``*_kernel``
    in the modules that hold them (helpers called from inside kernels are not launched)."""
    import importlib

    names = set()
    for module_name in KERNEL_MODULES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            fn = getattr(value, "fn", None)
            if name.endswith("_kernel") and inspect.isfunction(fn) and fn.__module__ == module_name:
                names.add(name)
    return names


def test_every_kernel_compiles_and_fits_shared_memory():
    rows = compile_for(TARGETS)
    errors = [row for row in rows if "error" in row]
    assert not errors, errors
    over = [row for row in rows if row["shared"] > row["limit"]]
    assert not over, f"more shared memory than the GPU has: {over}"
    compiled = {f"{row['target']}={row['case']}" for row in rows}
    assert compiled == set(TARGETS), "a case compiled nothing"
    on_h100 = {row["kernel"] for row in rows if row["target"] == 90}
    assert launched_kernels() <= on_h100, "a kernel the engine launches is in no case"
