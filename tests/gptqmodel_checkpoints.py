"""GPTQ and AWQ checkpoints written by GPT-QModel (a maintained quantizer on PyPI, the one
HF transformers loads GPTQ/AWQ checkpoints with), and their dequantized twins decoded by
GPT-QModel's own kernels: nothing here uses Octavo's reader or tests/int4_checkpoints.py.

Run as a script (``python tests/gptqmodel_checkpoints.py OUT NAME=SOURCE...``) in its own
process: importing gptqmodel sets process-wide state (thread pools, allocator variables).
For each NAME of ``CASES``, quantizing the float model folder SOURCE, it writes
``OUT/NAME/quantized`` (GPT-QModel's ``save``: its own config.json and packing) and
``OUT/NAME/reference`` (the same model with each quantized linear replaced by the fp32
weight GPT-QModel decodes from the checkpoint).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # its default (cores / 2) fails on 2 cores

CALIBRATION = [
    "The cat sat on the mat and looked at the dog for a long time.",
    "def add(a, b):\n    return a + b  # the sum of two numbers",
    "Hello there, how are you today? I hope the weather is fine.",
    "Water boils at one hundred degrees Celsius at sea level, they say.",
]


@dataclass(frozen=True)
class Case:
    method: str  # "gptq" or "awq"
    desc_act: bool = False  # GPTQ act-order: a g_idx that is not i // group_size
    sym: bool = True  # GPTQ sym / AWQ without zero_point: every zero is 8

    def config(self):
        from gptqmodel import AWQConfig, GPTQConfig

        # offload_to_disk (its default) writes every layer out and back: minutes, not seconds.
        common = {"bits": 4, "group_size": 32, "sym": self.sym, "offload_to_disk": False}
        if self.method == "gptq":
            return GPTQConfig(desc_act=self.desc_act, **common)
        return AWQConfig(**common)


CASES = {
    "gptq-sym": Case("gptq"),
    "gptq-act-order": Case("gptq", desc_act=True, sym=False),
    "awq-zero-point": Case("awq", sym=False),
    "awq-sym": Case("awq"),
}


def quantize(source: Path, out: Path, case: Case, tokenizer) -> Path:
    """GPT-QModel quantizes ``source`` on the CPU and saves it as it ships checkpoints."""
    from gptqmodel import BACKEND, GPTQModel

    model = GPTQModel.load(str(source), case.config(), device="cpu")
    calibration = [tokenizer(text)["input_ids"] for text in CALIBRATION * 2]
    # AWQ's default kernel needs CUDA; its portable torch kernel packs the same GEMM layout.
    backend = BACKEND.AWQ_TORCH if case.method == "awq" else BACKEND.AUTO
    model.quantize(calibration, batch_size=1, backend=backend)
    model.save(str(out))
    return out


def dequantized_weights(folder: Path, case: Case) -> dict:
    """``prefix.weight`` (fp32 ``[out, in]``) of each quantized linear, decoded by
    GPT-QModel's reader and its own unpacking formulas, scales widened to fp32 first so
    the product is exact.

    Loaded in fp16, the scales' own type: GPT-QModel's ``auto`` dtype on a CPU is bf16,
    which rounds every fp16 scale to 8 mantissa bits (weights off by up to 2^-8 relative,
    enough to flip a greedy token), and the reference would no longer be the checkpoint."""
    import torch
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear, PackableQuantLinear
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm

    backend = BACKEND.AWQ_TORCH if case.method == "awq" else BACKEND.TORCH
    model = GPTQModel.load(str(folder), device="cpu", backend=backend, dtype=torch.float16)
    weights = {}
    for name, module in model.model.named_modules():
        if not isinstance(module, BaseQuantLinear):
            continue
        assert module.scales.dtype == torch.float16, (name, module.scales.dtype)
        scales = module.scales.float()
        if case.method == "awq":
            weight = dequantize_gemm(module.qweight, module.qzeros, scales, 4, module.group_size)
        else:
            module.scales = scales
            weight = PackableQuantLinear.dequantize_weight(module)
        weights[f"{name}.weight"] = weight.t().to(torch.float32).contiguous()
    return weights


def write_reference(quantized: Path, out: Path, case: Case) -> Path:
    """``quantized`` with every quantized linear replaced by its dequantized fp32 weight."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = {}
    for file in sorted(quantized.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    packed = ("qweight", "qzeros", "scales", "g_idx")
    dense = {k: v.float() for k, v in tensors.items() if k.rsplit(".", 1)[-1] not in packed}
    dense.update(dequantized_weights(quantized, case))
    assert all(v.dtype == torch.float32 for v in dense.values())
    shutil.copytree(quantized, out, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(dense, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def main(out: Path, jobs: list[str]) -> None:
    from transformers import AutoTokenizer

    for job in jobs:
        name, source = job.split("=", 1)
        case = CASES[name]
        tokenizer = AutoTokenizer.from_pretrained(source)
        quantized = quantize(Path(source), out / name / "quantized", case, tokenizer)
        write_reference(quantized, out / name / "reference", case)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
