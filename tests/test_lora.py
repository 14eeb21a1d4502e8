"""LoRA adapters in PEFT's format, made here with peft (random, non-zero A and B): greedy
output token-identical to HF transformers + PEFT, a batch mixing the base model and
three adapters, slots and CPU memory evicted least recently used first, no prefix-cache
sharing across adapters, tensor parallelism, and bad adapters refused by name."""

from __future__ import annotations

import json

import pytest

from octavo import LLM, LoRARequest, SamplingParams
from octavo.kernels import cpu_build

from conftest import assert_all_blocks_free, hf_greedy
from lora_adapters import hf_with_adapter, make_adapter

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
# Enough KV for every request here (SmolLM2: ~350 tokens); the CPU default (2 GiB) would
# only cost the time and memory of zeroing it.
KV_CACHE_MEMORY = 16 << 20


def prompt(length: int, seed: int) -> list[int]:
    return [(seed * 37 + j * 11) % 40000 + 5 for j in range(length)]


@pytest.fixture(scope="module")
def adapters(tiny_folder, tmp_path_factory):
    """Three adapters of the tiny Qwen2 model: all modules, attention only, MLP only."""
    base = tiny_folder("qwen2")
    targets = [None, ["q_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"]]
    folders = [
        make_adapter(
            base, tmp_path_factory.mktemp(f"lora{i}"), seed=i, rank=4 + 4 * i, targets=targets[i]
        )
        for i in range(3)
    ]
    return [LoRARequest(f"a{i}", i + 1, str(folder)) for i, folder in enumerate(folders)]


@pytest.fixture(scope="module")
def expected(tiny_folder, adapters):
    """HF + PEFT greedy tokens: [prompt index][None, adapter 0, 1, 2]."""
    base = tiny_folder("qwen2")
    models = [hf_with_adapter(base, None)] + [
        hf_with_adapter(base, request.lora_path) for request in adapters
    ]
    return {
        seed: [hf_greedy(model, prompt(12 + seed, seed), 10) for model in models]
        for seed in range(3)
    }


def lora_llm(folder, **engine) -> LLM:
    engine = {"max_lora_rank": 16, "kv_cache_memory": KV_CACHE_MEMORY, **engine}
    return LLM(str(folder), dtype="float32", max_model_len=128, enable_lora=True, **engine)


@pytest.mark.parametrize("native", [True, False], ids=["native-kernels", "torch-path"])
def test_a_batch_mixing_base_and_three_adapters_matches_hf_peft(
    tiny_folder, adapters, expected, native
):
    """With the native kernels, decode steps take ``lora_delta`` and the prompts' step the
    masked GEMMs; on the torch path (no compiler) every step takes the GEMMs."""
    cpu_build.use_torch_path(not native)
    try:
        llm = lora_llm(tiny_folder("qwen2"), max_loras=3)
        requests = [None, *adapters]
        prompts = [prompt(12 + seed, seed) for seed in range(3) for _ in requests]
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests * 3)
    finally:
        cpu_build.use_torch_path(False)
    got = [out.outputs[0].token_ids for out in outputs]
    assert got == [tokens for seed in range(3) for tokens in expected[seed]]
    assert_all_blocks_free(llm.engine)


def test_more_adapters_than_slots_are_evicted_least_recently_used(tiny_folder, adapters, expected):
    llm = lora_llm(tiny_folder("qwen2"), max_loras=1, max_cpu_loras=1)
    for _ in range(2):
        outputs = llm.generate([prompt(12, 0)] * 3, GREEDY, use_tqdm=False, lora_request=adapters)
        assert [out.outputs[0].token_ids for out in outputs] == expected[0][1:]
    slots = llm.engine.executor.worker.adapters
    assert slots.num_loads >= 6, "one slot, one adapter in CPU memory: read again each time"
    assert len(slots.slots) == 1 and len(slots.cpu) == 1


def test_the_prefix_cache_is_not_shared_across_adapters(tiny_folder, adapters, expected):
    llm = lora_llm(tiny_folder("qwen2"), max_loras=2, block_size=8)
    text = prompt(40, 7)
    first = llm.generate([text], GREEDY, use_tqdm=False, lora_request=adapters[0])
    hits = llm.engine.stats().prefix_cache_hits
    other = llm.generate([text], GREEDY, use_tqdm=False, lora_request=adapters[1])
    assert llm.engine.stats().prefix_cache_hits == hits, "another adapter's KV is not reused"
    again = llm.generate([text], GREEDY, use_tqdm=False, lora_request=adapters[0])
    assert llm.engine.stats().prefix_cache_hits > hits, "the same adapter's KV is"
    assert again[0].outputs[0].token_ids == first[0].outputs[0].token_ids
    assert other[0].outputs[0].token_ids != first[0].outputs[0].token_ids


def test_adapters_under_tensor_parallelism_match(tiny_folder, adapters, expected):
    with lora_llm(tiny_folder("qwen2"), max_loras=3, tensor_parallel_size=2) as llm:
        outputs = llm.generate(
            [prompt(13, 1)] * 4, GREEDY, use_tqdm=False, lora_request=[None, *adapters]
        )
        assert [out.outputs[0].token_ids for out in outputs] == expected[1]


def test_smollm2_with_an_attention_adapter_matches_hf_peft(smol_folder, tmp_path):
    adapter = make_adapter(
        smol_folder, tmp_path / "smol", seed=3, rank=8, targets=["q_proj", "v_proj"]
    )
    ids = prompt(10, 3)
    want = hf_greedy(hf_with_adapter(smol_folder, adapter), ids, 8)
    llm = lora_llm(smol_folder)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    request = LoRARequest("s", 1, str(adapter))
    (out,) = llm.generate([ids], params, use_tqdm=False, lora_request=request)
    assert out.outputs[0].token_ids == want


def test_bad_adapters_are_refused_by_name_and_the_engine_goes_on(
    tiny_folder, adapters, expected, tmp_path
):
    llm = lora_llm(tiny_folder("qwen2"), max_lora_rank=8)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    other_base = make_adapter(tiny_folder("llama3"), tmp_path / "llama3", seed=1, rank=4)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["lm_head"]})
    )
    cases = {
        str(tmp_path / "missing"): "is not an adapter this server can load",
        str(broken): "adapter_config.json is not JSON",
        adapters[2].lora_path: "rank 12 is outside",
        str(other_base): "an adapter for another base model",
        str(unknown): r"target modules \['lm_head'\] are not",
    }
    for index, (path, message) in enumerate(cases.items(), start=10):
        with pytest.raises(ValueError, match=message):
            llm.generate(
                [prompt(12, 0)],
                GREEDY,
                use_tqdm=False,
                lora_request=LoRARequest("bad", index, path),
            )
    (out,) = llm.generate([prompt(12, 0)], GREEDY, use_tqdm=False, lora_request=adapters[0])
    assert out.outputs[0].token_ids == expected[0][1]
    plain = LLM(
        str(tiny_folder("qwen2")),
        dtype="float32",
        max_model_len=128,
        kv_cache_memory=KV_CACHE_MEMORY,
    )
    with pytest.raises(ValueError, match="need an engine started with enable_lora"):
        plain.generate([prompt(12, 0)], GREEDY, use_tqdm=False, lora_request=adapters[0])
