"""``--quantization int8`` (W8A8): the quantizer's error bound, each parallel linear layer
against its float reference, SmolLM2's next-token choices and footprint against fp32,
tensor parallelism combined, and unknown methods refused."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.cli import main
from octavo.distributed import parallel_state
from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.model_executor.layers.quantization import int8
from octavo.model_executor.layers.quantization.int8 import Int8LinearMethod, quantize_per_row
from octavo.model_executor.loader import weight_bytes


def test_per_row_quantization_is_within_half_a_step():
    values = torch.randn(64, 300) * torch.linspace(0.01, 10, 64).unsqueeze(1)
    quantized, scale = quantize_per_row(values)
    assert quantized.dtype == torch.int8 and int(quantized.abs().max()) <= 127
    error = (values - quantized.float() * scale.unsqueeze(1)).abs()
    assert bool((error <= scale.unsqueeze(1) / 2 + 1e-6).all())


LAYERS = {
    "column": lambda method: ColumnParallelLinear(96, 160, bias=True, method=method),
    "merged": lambda method: MergedColumnParallelLinear(96, [64, 64], method=method),
    "qkv": lambda method: QKVParallelLinear(96, 16, 6, 2, bias=True, method=method),
    "row": lambda method: RowParallelLinear(128, 96, bias=True, method=method),
}


@pytest.mark.parametrize("kind", sorted(LAYERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_parallel_layer_matches_its_float_reference(kind, dtype):
    torch.manual_seed(0)
    reference, quantized = LAYERS[kind](None), LAYERS[kind](Int8LinearMethod())
    with torch.no_grad():
        for param in reference.parameters():
            param.normal_(0, 0.1)
        quantized.load_state_dict(reference.state_dict())
    reference, quantized = reference.to(dtype), quantized.to(dtype)
    quantized.process_weights_after_loading()
    x = torch.randn(7, reference.input_size, dtype=dtype)
    expected, actual = reference(x).float(), quantized(x).float()
    relative = (actual - expected).norm() / expected.norm()
    assert actual.dtype == torch.float32 and relative < 0.03, float(relative)
    assert quantized.weight is None and quantized.qweight.dtype == torch.int8


@pytest.mark.parametrize("rows", [3, 9, 40])  # the integer kernel, then _int_mm or a GEMM
@pytest.mark.parametrize("int8_dot", [True, False], ids=["vnni", "no-int8-dot"])
def test_the_cpu_path_follows_the_cpus_int8_dot_products(monkeypatch, rows, int8_dot):
    """With int8 dot products (VNNI, AMX) more than 4 rows go to torch._int_mm; without
    them (AVX2-only, where it ran 23-28x slower than fp32) the rows take the block path (the
    integer kernel up to 16, a dequantized float GEMM above): never torch._int_mm."""
    calls = []
    int_mm = torch._int_mm

    def counted(a, b):
        calls.append(a.shape[0])
        return int_mm(a, b)

    monkeypatch.setattr(int8, "cpu_has_int8_dot", lambda: int8_dot)
    monkeypatch.setattr(torch, "_int_mm", counted)
    torch.manual_seed(rows)
    reference = ColumnParallelLinear(96, 160, bias=True)
    quantized = ColumnParallelLinear(96, 160, bias=True, method=Int8LinearMethod())
    with torch.no_grad():
        for param in reference.parameters():
            param.normal_(0, 0.1)
        quantized.load_state_dict(reference.state_dict())
    quantized.process_weights_after_loading()
    x = torch.randn(rows, 96)
    expected, actual = reference(x), quantized(x)
    assert (actual - expected).norm() / expected.norm() < 0.03
    assert calls == ([rows] if int8_dot and rows > 4 else [])


NATURAL = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "1, 2, 3, 4,",
    "The best way to learn a language is",
    "Water boils at",
    "import numpy as",
    "The opposite of hot is",
]


def test_smollm2_int8_picks_the_same_next_tokens_with_a_quarter_of_the_linear_bytes(
    smol_folder, monkeypatch
):
    """W8A8 is lossy: on prompts with a clear next token it agrees with fp32 (7 of 8 or
    better) and the weights shrink (the vocabulary-sized embedding stays fp32). Measured
    unpacked: a prepacked tied LM head is a second copy of the embedding in both runs."""
    monkeypatch.setenv("OCTAVO_CPU_PREPACK", "0")
    prompts = NATURAL
    params = SamplingParams(temperature=0.0, max_tokens=1)
    runs = {}
    for quantization in (None, "int8"):
        llm = LLM(
            str(smol_folder),
            dtype="float32",
            max_model_len=512,
            quantization=quantization,
            kv_cache_memory=64 << 20,  # room for the eight prompts, not the 2 GiB default
        )
        runs[quantization] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        runs[f"{quantization}-bytes"] = weight_bytes(llm.engine.executor.worker.model)
    same = [a.token_ids == b.token_ids for a, b in zip(runs[None], runs["int8"], strict=True)]
    assert sum(same) >= len(prompts) - 1, same
    assert runs["int8-bytes"] < 0.5 * runs["None-bytes"]


def test_int8_under_tensor_parallelism(tiny_folder):
    with LLM(
        str(tiny_folder("llama3")),
        dtype="float32",
        max_model_len=128,
        quantization="int8",
        tensor_parallel_size=2,
        kv_cache_memory=16 << 20,
    ) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        (output,) = llm.generate(["Hello there"], params, use_tqdm=False)
    assert len(output.outputs[0].token_ids) == 12


def test_an_unknown_method_is_refused(tiny_folder, capsys):
    with pytest.raises(
        ValueError, match="unknown quantization 'int4'; supported: int8, fp8, gptq, awq, gguf"
    ):
        LLM(str(tiny_folder("llama3")), quantization="int4")
    with pytest.raises(SystemExit) as exited:
        main(["serve", str(tiny_folder("llama3")), "--quantization", "nf4"])
    assert exited.value.code == 2
    assert (
        "--quantization: 'nf4' is not one of int8, fp8, gptq, awq, gguf" in capsys.readouterr().err
    )


@pytest.fixture(autouse=True)
def one_rank():
    parallel_state.set_tensor_parallel_group(TensorParallelGroup())


def test_weight_bytes_counts_prepacked_bf16_weights(tiny_folder):
    """bf16 linears prepacked for oneDNN (opaque tensors) are counted too."""
    llm = LLM(str(tiny_folder("llama3")), dtype="bfloat16", max_model_len=64, kv_cache_memory=2**20)
    model = llm.engine.executor.worker.model
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weight_bytes(model) >= parameters
