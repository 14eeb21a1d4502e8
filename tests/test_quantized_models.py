"""Quantized models end to end: GPTQ/AWQ checkpoints written by the test in their on-disk
formats (detected from config.json) against their dequantized twins, tensor parallelism
on a GPTQ checkpoint, the embedded SmolLM2 served from its Q4_1 GGUF kept quantized
(flag or ``--model file.gguf``), methods that do not fit refused, and perplexity scored
the way lm-eval-harness's ``local-completions`` does (``echo``, ``logprobs=1``,
``max_tokens=1``): int8 within +10 % of bf16, Q4_1 kept within +2 % of its expansion.

The reference is always HF transformers in fp32 on the dequantized (or expanded) weights.
The torch path dequantizes exactly, so its greedy tokens must equal the reference's; the
native kernels quantize activations per 32 columns, so each token of the engine's own
greedy sequence must score within a stated bound of the reference's logprob of it.
GPTQ/AWQ checkpoints that Octavo did not write: test_gptqmodel_checkpoints.py."""

from __future__ import annotations

import json
import math

import pytest

from octavo import LLM
from octavo.entrypoints.openai.context import ServerConfig
from octavo.model_executor.embedded import gguf_path
from octavo.model_executor.loader import weight_bytes
from quantized_references import (
    forced_torch_path,
    greedy_runs,
    greedy_runs_of,
    hf_float32,
    largest_logprob_gap,
    reference_greedy,
)

from int4_checkpoints import write_int4_checkpoint
from server_harness import openai_client, served_model

PROMPTS = ["Hello there", "The cat sat on", "def add(a, b):"]
TOKENS = 12
INT4_BOUND = 0.05  # nats, native int4 kernel vs the dequantized reference; measured < 0.01 (AVX2)
CASES = [("gptq", False), ("gptq", True), ("awq", False)]  # (method, act order)
KV_POOL = 64 << 20  # bytes: room for every sequence here (the tests default to 512 MiB)
# A guard: the bf16 and int8 SmolLM2 engines load, prepack and capture their decode graphs
# (bf16 emulated on a CPU without it); one of three took past 120 s on an AVX2-only CPU
# while the e2e suite ran beside.
SMOL_STARTUP_SECONDS = 300.0


def reference_tokens(model, runs, max_tokens: int = TOKENS) -> list[list[int]]:
    """HF fp32 greedy continuations of the runs' prompts, by ``model``."""
    return [reference_greedy(model, run.prompt_ids, max_tokens) for run in runs]


@pytest.fixture(scope="module")
def int4_folders(tmp_path_factory, tiny_folder):
    """(method, act order) → (quantized checkpoint, dequantized reference)."""
    root = tmp_path_factory.mktemp("int4")
    return {
        (method, act): write_int4_checkpoint(
            tiny_folder("llama3"), root / f"{method}-{act}", method, act_order=act
        )
        for method, act in CASES
    }


@pytest.fixture(scope="module")
def int4_references(int4_folders):
    """(method, act order) → HF fp32 model of the dequantized reference, loaded once."""
    return {case: hf_float32(reference) for case, (_, reference) in int4_folders.items()}


@pytest.fixture
def torch_path():
    with forced_torch_path():
        yield


@pytest.mark.parametrize(("method", "act_order"), CASES)
def test_int4_checkpoint_matches_its_dequantized_reference(
    int4_folders, int4_references, method, act_order
):
    """The native integer kernel scores every token of its own greedy sequences within
    ``INT4_BOUND`` of the dequantized reference."""
    quantized, _ = int4_folders[method, act_order]
    runs = greedy_runs(quantized, PROMPTS, TOKENS)
    assert largest_logprob_gap(int4_references[method, act_order], runs) < INT4_BOUND


@pytest.mark.parametrize(("method", "act_order"), CASES)
def test_int4_checkpoint_is_token_identical_on_the_torch_path(
    int4_folders, int4_references, method, act_order, torch_path
):
    """Weights dequantized exactly: greedy output equals HF's on the reference weights."""
    quantized, _ = int4_folders[method, act_order]
    runs = greedy_runs(quantized, PROMPTS, TOKENS)
    assert [run.tokens for run in runs] == reference_tokens(
        int4_references[method, act_order], runs
    )


def test_gptq_under_tensor_parallelism(tmp_path, tiny_folder, torch_path):
    """Two ranks each keep their rows (column layers) or 32-column blocks (row layers)."""
    quantized, reference = write_int4_checkpoint(tiny_folder("qwen2"), tmp_path, "gptq")
    runs = greedy_runs(quantized, PROMPTS, TOKENS, tensor_parallel_size=2)
    assert [run.tokens for run in runs] == reference_tokens(hf_float32(reference), runs)


def test_a_load_time_method_refuses_a_quantized_checkpoint(int4_folders):
    quantized, _ = int4_folders["gptq", False]
    with pytest.raises(ValueError, match="does not match the checkpoint, which is already"):
        LLM(str(quantized), quantization="int8")


def test_an_unknown_checkpoint_method_is_named(tmp_path, tiny_folder):
    import shutil

    folder = shutil.copytree(tiny_folder("llama3"), tmp_path / "bnb")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantized with 'bitsandbytes', which Octavo does not"):
        LLM(str(folder))


NATURAL = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "Water boils at",
    "The opposite of hot is",
    "import numpy as",
]
GGUF_TOKENS = 8
# nats, the worst token of the native Q4_1/Q8_0 kernels vs the fp32 expansion: measured 0.16
# (AVX2) with the 8 sequences' decode steps on the integer kernels (activations quantized per
# 32 columns, llama.cpp's scheme); 1.5e-5 when steps of 5 or more rows were dequantized.
GGUF_BOUND = 0.25


def float_bytes(model) -> int:
    """Bytes of a float model's parameters (a tied embedding and LM head counted once)."""
    unique = {
        tensor.data_ptr(): tensor.numel() * tensor.element_size() for tensor in model.parameters()
    }
    return sum(unique.values())


def test_embedded_model_runs_from_its_q4_1_gguf_kept_quantized(smol_folder, hf_smol):
    """The native kernels score every token of their own greedy sequences within
    ``GGUF_BOUND`` of the float expansion (HF, fp32); no more bytes than the file
    (embedding and LM head share its Q8_0 blocks), and under 0.4 of the expansion's fp32
    parameters (HF's; an engine of the expansion holds those and its prepacked copies);
    ``--model file.gguf`` is the same model."""
    runs, sizes = {}, {}
    for name, engine in {
        "gguf": {"model": str(smol_folder), "quantization": "gguf"},
        "file": {"model": str(gguf_path())},
    }.items():
        with LLM(dtype="float32", max_model_len=256, kv_cache_memory=KV_POOL, **engine) as llm:
            sizes[name] = weight_bytes(llm.engine.executor.worker.model)
            runs[name] = greedy_runs_of(llm, NATURAL, GGUF_TOKENS)
    gap = largest_logprob_gap(hf_smol, runs["gguf"])
    print("largest Q4_1 logprob gap (nats)", gap)  # for the issue note (pytest -s)
    assert gap < GGUF_BOUND
    assert [run.tokens for run in runs["file"]] == [run.tokens for run in runs["gguf"]]
    assert sizes["file"] == sizes["gguf"]
    assert sizes["gguf"] < 0.4 * float_bytes(hf_smol)
    assert sizes["gguf"] <= gguf_path().stat().st_size  # nothing expanded, one LM head


def test_gguf_kept_quantized_is_token_identical_on_the_torch_path(smol_folder, hf_smol, torch_path):
    """Q4_1/Q8_0 blocks dequantized exactly: greedy output equals HF's on the expansion
    (three prompts: the torch path expands every block at every step)."""
    runs = greedy_runs(smol_folder, NATURAL[:3], GGUF_TOKENS, quantization="gguf")
    expected = [reference_greedy(hf_smol, run.prompt_ids, GGUF_TOKENS) for run in runs]
    assert [run.tokens for run in runs] == expected


TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden screw press into a "
    "system that could produce books quickly and cheaply. Before his invention, books were "
    "copied by hand, usually by monks, and a single volume could take months to finish. "
    "Within fifty years, printing shops had spread to more than two hundred cities across "
    "Europe, and millions of books were in circulation. The press changed how ideas moved: "
    "scientists could share their results, religious reformers could reach ordinary "
    "readers, and governments could publish laws that everyone was expected to know."
)


def perplexity(server) -> float:
    """exp(mean NLL) of TEXT's tokens after the first, from the echoed prompt logprobs."""
    client = openai_client(server)
    response = client.completions.create(
        model="smol", prompt=TEXT, echo=True, logprobs=1, max_tokens=1, temperature=0.0
    )
    logprobs = response.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert response.choices[0].text.startswith(TEXT)
    scored = logprobs.token_logprobs[1:-1]  # the last entry is the generated token
    assert len(scored) == response.usage.prompt_tokens - 1
    assert all(len(top) >= 1 for top in logprobs.top_logprobs[1:])
    return math.exp(-sum(scored) / len(scored))


def test_perplexity_through_completions_echo_logprobs(smol_folder):
    config = ServerConfig(served_model_names=["smol"], model_root="smol")
    figures = {}
    for name, quantization in (("bf16", None), ("int8", "int8"), ("q4_1", "gguf")):
        engine = {
            "max_model_len": 512,
            "dtype": "bfloat16",
            "quantization": quantization,
            "kv_cache_memory": KV_POOL,
        }
        with served_model(str(smol_folder), config, 2, SMOL_STARTUP_SECONDS, **engine) as server:
            figures[name] = perplexity(server)
    print("perplexity", figures)  # for the issue note (pytest -s)
    assert 1.0 < figures["bf16"] < 100.0, figures
    assert figures["int8"] <= 1.10 * figures["bf16"], figures
    assert figures["q4_1"] <= 1.02 * figures["bf16"], figures
