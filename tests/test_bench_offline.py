"""``octavo bench offline``: seeded workloads, and a tiny end-to-end run into a temp folder."""

from __future__ import annotations

import json

import pytest

from octavo.model_executor.model_config import ModelConfig
from octavo_bench import offline
from octavo_bench.capacity import sequences_that_fit
from octavo_bench.workloads import build_workloads, common_prefix_length


@pytest.fixture(scope="module")
def full_workloads(smol_tokenizer):
    return build_workloads(smol_tokenizer, list("abcdef"), scale=1.0)


def test_workloads_match_the_issue_at_full_scale(full_workloads, smol_tokenizer):
    a, b, c, d = (full_workloads[name] for name in "abcd")
    assert a.num_requests == 32 and set(a.max_tokens) == {128}
    assert len({tuple(prompt) for prompt in a.prompts}) == 32  # varied topics
    assert smol_tokenizer.decode(a.prompts[0]).count("<|im_start|>") == 3  # chat template
    assert b.num_requests == 64
    assert all(16 <= len(prompt) <= 512 for prompt in b.prompts)
    assert all(16 <= count <= 256 for count in b.max_tokens)
    special = set(smol_tokenizer.all_special_ids)
    assert not special & {token for prompt in b.prompts for token in prompt}
    assert c.num_requests == 1 and c.max_tokens == [128]
    assert d.num_requests == 64 and d.warmup_prompt is not None
    assert 990 <= common_prefix_length([d.warmup_prompt, *d.prompts]) <= 1040
    e = full_workloads["e"]
    assert e.num_requests == 16 and set(e.max_tokens) == {256}
    assert {len(prompt) for prompt in e.prompts} == {1536}
    assert len({tuple(prompt[:8]) for prompt in e.prompts}) == 16  # no shared prefix
    f = full_workloads["f"]
    assert f.num_requests == 1 and f.max_tokens == [128] and len(f.prompts[0]) == 6000


def test_workloads_are_seeded(smol_tokenizer, full_workloads):
    again = build_workloads(smol_tokenizer, ["b", "d"], scale=1.0)
    assert again["b"].prompts == full_workloads["b"].prompts
    assert again["b"].max_tokens == full_workloads["b"].max_tokens
    assert again["d"].prompts == full_workloads["d"].prompts
    other = build_workloads(smol_tokenizer, ["b"], scale=1.0, seed=7)["b"]
    assert other.prompts != full_workloads["b"].prompts


def test_scale_shrinks_counts_and_lengths(smol_tokenizer):
    small = build_workloads(smol_tokenizer, ["a", "b"], scale=0.05)
    assert small["a"].num_requests == 2 and small["a"].max_tokens == [6, 6]
    assert small["b"].num_requests == 3
    assert all(len(prompt) <= 26 for prompt in small["b"].prompts)


def test_sequences_that_fit_contiguous_vs_paged():
    import torch

    config = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "vocab_size": 100,
        }
    )
    # 2 layers x K and V x 1 head x 16 dims x 4 bytes = 256 bytes per token
    fit = sequences_that_fit(config, torch.float32, 256 * 4096, 2048, 16, 100.0, 3)
    assert fit.bytes_per_token == 256
    hybrid = ModelConfig.from_dict(  # LFM2's layout: only its attention layer keeps K and V
        {
            "architectures": ["Lfm2ForCausalLM"],
            "model_type": "lfm2",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "vocab_size": 100,
            "max_position_embeddings": 2048,
            "layer_types": ["conv", "full_attention", "conv", "conv"],
        }
    )
    hybrid_fit = sequences_that_fit(hybrid, torch.float32, 2**20, 2048, 16, 100.0, 3)
    assert hybrid_fit.bytes_per_token == 128  # 1 layer x K and V x 1 head x 16 dims x 4 bytes
    assert fit.contiguous == 2  # 4096 tokens / 2048 per preallocated sequence
    assert fit.paged == (4096 // 16 - 1) // 7  # 255 usable blocks, 7 blocks per sequence


def test_tiny_end_to_end_run(tiny_folder, tmp_path, capsys):
    out = tmp_path / "bench"
    code = offline.main(
        [
            "--model",
            str(tiny_folder("llama3")),
            "--dtype",
            "float32",
            "--scale",
            "0.05",
            "--baselines",
            "hf-fp32",
            "--kv-cache-memory",
            str(8 * 2**20),
            "--output-dir",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads((out / "offline.json").read_text())
    assert (out / "offline.png").stat().st_size > 0
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["torch_version"]
    workloads = report["workloads"]
    assert set(workloads) == set("abcdef")
    for name in "ef":
        assert set(workloads[name]["results"]) == {"octavo"}  # long contexts: no HF run
    for name, entry in workloads.items():
        assert entry["results"], name
        if name in "ef":
            continue
        assert all(result["tok_s"] > 0 for result in entry["results"].values()), name
        assert entry["ratios"] and all(value > 0 for value in entry["ratios"].values()), name
    for name in "abc":
        assert set(workloads[name]["results"]) == {"octavo", "hf-fp32"}
        assert "octavo/hf-fp32" in workloads[name]["ratios"]
    for name in "ab":
        kv = workloads[name]["kv"]
        assert 0.0 < kv["utilisation_mean"] <= 1.0
        assert kv["sequences_that_fit"]["paged"] >= kv["sequences_that_fit"]["contiguous"]
    prefix = workloads["d"]
    assert set(prefix["results"]) == {"octavo", "octavo-no-prefix-cache"}
    assert prefix["results"]["octavo"]["prefix_cache_hit_rate"] > 0.5
    assert "ttft_mean_off/on" in prefix["ratios"]
    printed = capsys.readouterr()
    assert "vs hf-fp32" in printed.out and "ratio off/on" in printed.out
