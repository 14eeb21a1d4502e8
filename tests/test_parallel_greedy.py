"""Tensor and pipeline parallelism on CPU (gloo): greedy fp32 output token-identical to one rank.

Each layout runs the eight mixed prompts with a small step budget (chunked prefill) and a
KV pool squeezed until sequences are preempted and recomputed, then checks every block
came back and every worker process is gone after ``shutdown``. The layouts are plumbing
(which rank holds which heads, layers and vocabulary rows), so every model is a tiny
random one: "smollm2" has SmolLM2's head layout (9 attention heads, 3 KV heads, a tied
LM head), so its tensor-parallel size is 3 (2 is refused, see test_parallel_layout.py),
and 3 layers, so its two pipeline stages are uneven (2 + 1); the tiny Qwen2 at 4 ranks has
fewer KV heads (2) than ranks, so each KV head is replicated on two ranks; the tiny
Llama-3 has one KV head. The real SmolLM2's numbers are checked against HF transformers
in test_greedy_matches_hf.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from octavo import LLM, SamplingParams
from octavo.executor.multiproc_executor import MultiprocExecutor
from octavo.model_executor.model_config import ModelConfig

from conftest import assert_all_blocks_free
from greedy_prompts import mixed_prompts, run_batch
from tiny_models import build_tiny_model

BLOCKS_PER_WORKER = 30  # fewer than the batch needs: sequences are preempted
STEP_BUDGET = 48  # tokens per step: the longer prompts are prefilled in chunks
SMOLLM2_HEAD_LAYOUT = {  # SmolLM2-135M's heads (head_dim 16 instead of 64), 3 layers
    "hidden_size": 144,
    "intermediate_size": 192,
    "num_hidden_layers": 3,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "rope_theta": 100000.0,
    "rope_scaling": None,
    "tie_word_embeddings": True,
}


def worker_kv_bytes(config: ModelConfig, tensor: int, pipeline: int, blocks: int) -> int:
    """Bytes of ``blocks`` KV blocks on the busiest worker (fp32, 16 tokens a block)."""
    kv_heads = max(1, config.num_kv_heads // tensor)
    layers = math.ceil(config.num_layers / pipeline)
    return blocks * 2 * 16 * kv_heads * config.head_dim * 4 * layers


def start_layout(folder: Path, tensor: int, pipeline: int) -> LLM:
    """An engine of ``tensor × pipeline`` ranks with the small step budget and squeezed pool."""
    config = ModelConfig.from_folder(folder)
    return LLM(
        str(folder),
        dtype="float32",
        max_model_len=384,
        max_num_batched_tokens=STEP_BUDGET,
        kv_cache_memory=worker_kv_bytes(config, tensor, pipeline, BLOCKS_PER_WORKER),
        tensor_parallel_size=tensor,
        pipeline_parallel_size=pipeline,
    )


@pytest.fixture(scope="module")
def smollm2_shaped_folder(tmp_path_factory, smol_tokenizer) -> Path:
    """A tiny random Llama with SmolLM2's head layout (see SMOLLM2_HEAD_LAYOUT)."""
    folder = tmp_path_factory.mktemp("smollm2-shaped")
    return build_tiny_model(folder, "llama3", smol_tokenizer, **SMOLLM2_HEAD_LAYOUT)


@pytest.fixture(scope="module")
def folders(smollm2_shaped_folder, tiny_folder) -> dict[str, Path]:
    return {
        "smollm2": smollm2_shaped_folder,
        "qwen2": tiny_folder("qwen2"),
        "llama3": tiny_folder("llama3"),
    }


@pytest.fixture(scope="module")
def engines(folders) -> Iterator[Callable[[str, int, int], LLM]]:
    """Factory: the module's one engine per (model, tensor, pipeline), started on first use
    (the tests before a layout's own test only read from it); shut down at the end."""
    started: dict[tuple[str, int, int], LLM] = {}

    def engine(name: str, tensor: int, pipeline: int) -> LLM:
        key = (name, tensor, pipeline)
        if key not in started:
            started[key] = start_layout(folders[name], tensor, pipeline)
        return started[key]

    yield engine
    for llm in started.values():
        llm.shutdown()


@pytest.fixture(scope="module")
def prompts(smol_tokenizer) -> list[list[int]]:
    return mixed_prompts(smol_tokenizer)


@pytest.fixture(scope="module")
def references(engines, prompts) -> Callable[[str], list[list[int]]]:
    """One rank's greedy output per model, computed once (the layouts are compared with it)."""
    made: dict[str, list[list[int]]] = {}

    def reference(name: str) -> list[list[int]]:
        if name not in made:
            made[name] = run_batch(engines(name, 1, 1), prompts)
        return made[name]

    return reference


def test_each_rank_holds_only_its_shard(engines):
    """Two ranks of the tiny Llama-3 hold half the MLP and attention weights each (and the
    KV cache is sized per rank): their summed parameter bytes are below twice the model's."""
    sizes = engines("llama3", 2, 1).engine.executor.call("parameter_bytes")
    whole = engines("llama3", 1, 1).engine.executor.worker.parameter_bytes()
    assert len(sizes) == 2
    assert all(size < 0.6 * whole for size in sizes), (sizes, whole)


def test_seeded_sampling_with_forks_matches_one_rank(engines, prompts):
    """``n = 3`` sampled completions with a seed (forks share the prompt's blocks, copied on
    write on every rank): the driver samples exactly what one rank would."""
    params = SamplingParams(n=3, temperature=0.8, top_p=0.95, seed=11, max_tokens=16)

    def sample(tensor: int, pipeline: int) -> list[list[int]]:
        llm = engines("llama3", tensor, pipeline)
        (output,) = llm.generate([prompts[1]], params, use_tqdm=False)
        assert_all_blocks_free(llm.engine)
        return [completion.token_ids for completion in output.outputs]

    expected = sample(1, 1)
    assert len({tuple(tokens) for tokens in expected}) > 1  # really sampled
    assert sample(2, 2) == expected


@pytest.mark.parametrize(
    ("name", "tensor", "pipeline"),
    [
        ("smollm2", 3, 1),
        ("smollm2", 1, 2),
        ("llama3", 2, 1),
        ("llama3", 1, 2),
        ("llama3", 2, 2),
        ("qwen2", 4, 1),
        ("qwen2", 2, 2),
    ],
)
def test_layout_is_token_identical_to_one_rank(
    engines, references, prompts, name, tensor, pipeline
):
    expected = references(name)
    llm = engines(name, tensor, pipeline)
    preemptions_before = llm.engine.stats().num_preemptions
    try:
        outputs = run_batch(llm, prompts)
    finally:
        llm.shutdown()
    assert outputs == expected
    assert llm.engine.stats().num_preemptions > preemptions_before
    assert_all_blocks_free(llm.engine)
    executor = llm.engine.executor
    assert isinstance(executor, MultiprocExecutor)
    assert len(executor.workers) == tensor * pipeline
    assert all(worker.process.poll() is not None for worker in executor.workers)
