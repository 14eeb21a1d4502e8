"""GPTQ and AWQ checkpoints that Octavo did not write.

GPT-QModel (the maintained quantizer HF transformers loads GPTQ/AWQ checkpoints with)
quantizes tiny random models on the CPU and saves them with its own packing and
config.json; GPT-QModel's own reader and unpacking formulas decode the reference weights
(tests/gptqmodel_checkpoints.py, in a subprocess). Neither Octavo's reader nor our packer
(tests/int4_checkpoints.py) is involved in the reference, so a misunderstanding of the
format that both share cannot pass.

- The torch path dequantizes exactly in fp32: its greedy tokens equal HF transformers'
  running GPT-QModel's dequantized weights in fp32.
- The native kernel quantizes activations per 32 columns, so tokens may differ; every
  token of its own greedy sequence must score within ``NATIVE_BOUND`` nats of the
  reference's (teacher-forced) logprob of that token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fixture_cache import cached_folder, content_key
from octavo.model_executor.gptq_checkpoint import iterate_int4_checkpoint
from octavo.model_executor.layers.quantization.quantized_tensor import QuantizedTensor
from quantized_references import (
    forced_torch_path,
    greedy_runs,
    hf_float32,
    largest_logprob_gap,
    reference_greedy,
)

from tiny_models import build_tiny_model

PROMPTS = ["Hello there", "The cat sat on", "def add(a, b):"]
TOKENS = 12
NATIVE_BOUND = 0.05  # nats; measured ≤ 0.01 on these models (AVX2)
# GPTQ on the Llama-3 model (GQA 4:1, tied embeddings, 16-wide K/V); AWQ on Qwen2 (q/k/v
# biases) widened to 128: GPT-QModel's AWQ clip search needs output sizes that are
# multiples of 64.
SOURCES = {"llama3": {}, "qwen2": {"hidden_size": 128}}
CASES = {"gptq-sym": "llama3", "gptq-act-order": "llama3", "awq-zero-point": "qwen2"}
HELPER = Path(__file__).with_name("gptqmodel_checkpoints.py")


@pytest.fixture(scope="module")
def gptqmodel_folders(tmp_path_factory, smol_tokenizer) -> dict[str, tuple[Path, Path]]:
    """Case name → (GPT-QModel's checkpoint, its dequantized fp32 twin). Quantizing takes
    GPT-QModel ~40 s of CPU: the checkpoints are kept across runs (tests/fixture_cache.py),
    keyed by the source models' bytes, the helper script and the writers' versions."""
    scratch = tmp_path_factory.mktemp("gptqmodel")
    sources = {
        arch: build_tiny_model(scratch / arch, arch, smol_tokenizer, **overrides)
        for arch, overrides in SOURCES.items()
    }
    jobs = [f"{name}={sources[arch]}" for name, arch in CASES.items()]

    def quantize(out: Path) -> None:
        command = [sys.executable, str(HELPER), str(out), *jobs]
        # GPT-QModel writes its logs into logs/ under the working folder: keep them in tmp.
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=scratch)
        assert done.returncode == 0, done.stderr[-4000:]

    key = content_key(
        [HELPER],
        [sources[arch] for arch in SOURCES],
        ["gptqmodel", "torch", "transformers"],
    )
    root = cached_folder("gptqmodel", f"{'-'.join(CASES)}-{key}", quantize)
    return {name: (root / name / "quantized", root / name / "reference") for name in CASES}


@pytest.fixture(scope="module")
def references(gptqmodel_folders):
    """Case name → HF transformers' fp32 model of the dequantized twin."""
    return {name: hf_float32(reference) for name, (_, reference) in gptqmodel_folders.items()}


def test_checkpoints_are_gptqmodels_own(gptqmodel_folders):
    """The checkpoints carry GPT-QModel's config (not ours): its writer's name, its keys."""
    for name, (quantized, _) in gptqmodel_folders.items():
        settings = json.loads((quantized / "config.json").read_text())["quantization_config"]
        assert settings["quant_method"] == name.split("-")[0], settings
        assert any("gptqmodel" in writer for writer in settings["meta"]["quantizer"]), settings


@pytest.mark.parametrize("name", CASES)
def test_octavos_reader_decodes_every_weight_bit_for_bit_as_gptqmodel(gptqmodel_folders, name):
    """Not merely the same tokens: each dequantized matrix equals GPT-QModel's decoding
    exactly, so a reference rounded on the way (GPT-QModel's CPU default loads the fp16
    scales as bf16: up to 2^-8 relative off) or a misread g_idx fails on any CPU."""
    quantized, reference = gptqmodel_folders[name]
    settings = json.loads((quantized / "config.json").read_text())["quantization_config"]
    tensors = iterate_int4_checkpoint(quantized, settings["quant_method"], settings)
    ours = {key: t.dequantize() for key, t in tensors if isinstance(t, QuantizedTensor)}
    theirs = load_file(str(reference / "model.safetensors"))
    assert ours and all(torch.equal(weight, theirs[key]) for key, weight in ours.items())


@pytest.mark.parametrize("name", CASES)
def test_torch_path_is_token_identical_to_gptqmodels_dequantization(
    gptqmodel_folders, references, name
):
    quantized, _ = gptqmodel_folders[name]
    with forced_torch_path():
        runs = greedy_runs(quantized, PROMPTS, TOKENS)
    expected = [reference_greedy(references[name], run.prompt_ids, TOKENS) for run in runs]
    assert [run.tokens for run in runs] == expected


@pytest.mark.parametrize("name", CASES)
def test_native_path_scores_its_whole_sequence_like_the_reference(
    gptqmodel_folders, references, name
):
    quantized, _ = gptqmodel_folders[name]
    runs = greedy_runs(quantized, PROMPTS, TOKENS)
    assert all(len(run.tokens) == TOKENS for run in runs)
    assert largest_logprob_gap(references[name], runs) < NATIVE_BOUND
