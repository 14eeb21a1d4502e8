"""Context lengths beyond a checkpoint's ``max_position_embeddings``: the longest length is
derived from ``rope_scaling`` as vLLM's ``_get_and_verify_max_len`` derives it, and
``--hf-overrides`` sets rope scaling on a model whose config.json has none.

A tiny random Llama with 64 positions is served through the offline ``LLM`` to twice that,
its prefill chunks crossing position 64, and its greedy tokens are HF transformers' with
the same rope config, in fp32.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from octavo import LLM, SamplingParams
from octavo.config import EngineArgs
from octavo.model_executor.context_length import context_length_of
from octavo.model_executor.hf_overrides import apply_hf_overrides
from octavo.model_executor.rope_parameters import rope_parameters_for

from conftest import hf_greedy
from serve_args import clean_environment, parse  # noqa: F401 (an autouse fixture)
from tiny_models import build_tiny_model

ORIGINAL = 64  # the tiny checkpoint's max_position_embeddings
NEW_TOKENS = 24
LINEAR = {"rope_type": "linear", "factor": 2.0}
ROPE_SCALINGS = {
    "linear": LINEAR,
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": ORIGINAL},
}
ENGINE = {"dtype": "float32", "kv_cache_memory": 8 << 20, "max_num_batched_tokens": 32}
NEAR_TIE = 1e-3  # logits closer than this may order differently in another kernel


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory, smol_tokenizer):
    """Factory: the same random weights with 64 positions and ``rope_scaling`` by name
    ("none": no scaling)."""
    made = {}

    def make(name: str):
        if name not in made:
            folder = tmp_path_factory.mktemp(f"long-{name}")
            scaling = ROPE_SCALINGS.get(name)
            build_tiny_model(
                folder,
                "llama3",
                smol_tokenizer,
                max_position_embeddings=ORIGINAL,
                rope_theta=10000.0,
                rope_scaling=scaling,
            )
            made[name] = folder
        return made[name]

    return make


@pytest.fixture(scope="module")
def long_prompt(smol_tokenizer) -> list[int]:
    """About 100 tokens: past the 64 positions, with room for the new tokens in 128."""
    text = "Tell me about PagedAttention, rope scaling and long contexts in detail. " * 8
    ids = smol_tokenizer.encode(text)[:100]
    assert len(ids) > ORIGINAL and len(ids) + NEW_TOKENS <= 2 * ORIGINAL
    return ids


def clear_prefix(model, prompt: list[int], tokens: list[int]) -> int:
    """How many of ``tokens`` the reference chose by a clear margin (up to its first
    near-tie between its two best logits, where another kernel may order them apart)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    for index in range(len(tokens)):
        best, second = logits[len(prompt) - 1 + index].topk(2).values.tolist()
        if best - second < NEAR_TIE:
            return index
    return len(tokens)


def octavo_greedy(folder, prompt: list[int], **engine) -> tuple[int, list[int]]:
    """The engine's max_model_len and its greedy tokens (EOS ignored)."""
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with LLM(str(folder), **ENGINE, **engine) as llm:
        output = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        return llm.engine.max_model_len, list(output.outputs[0].token_ids)


@pytest.fixture(scope="module")
def reference(tiny_long, long_prompt):
    """Factory: HF's greedy tokens for the model by name, and how many of them are clear
    of near-ties (each computed once)."""
    made: dict[str, tuple[list[int], int]] = {}

    def make(name: str) -> tuple[list[int], int]:
        if name not in made:
            folder = tiny_long(name)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            expected = hf_greedy(model, long_prompt, NEW_TOKENS, ignore_eos=True)
            made[name] = expected, clear_prefix(model, long_prompt, expected)
        return made[name]

    return make


def assert_matches_reference(reference, name: str, tokens: list[int]) -> None:
    expected, clear = reference(name)
    assert clear >= NEW_TOKENS // 2, f"the reference ties after {clear} tokens"
    assert tokens[:clear] == expected[:clear]


@pytest.mark.parametrize("name", sorted(ROPE_SCALINGS))
def test_a_rope_scaled_model_serves_past_its_positions_as_transformers(
    name, tiny_long, long_prompt, reference
):
    """The derived max_model_len is 2 x 64; a 100-token prompt (prefilled in chunks of 32,
    across position 64) and 24 greedy tokens match HF with the same rope config."""
    max_model_len, tokens = octavo_greedy(tiny_long(name), long_prompt)
    assert max_model_len == 2 * ORIGINAL
    assert_matches_reference(reference, name, tokens)


def test_the_scaling_changes_the_tokens(reference):
    """Not vacuous: HF's tokens past 64 positions differ with and without the scaling."""
    assert reference("none")[0] != reference("linear")[0]


def test_a_model_without_rope_scaling_refuses_more_positions(tiny_long):
    with pytest.raises(ValueError) as refused:
        LLM(str(tiny_long("none")), max_model_len=2 * ORIGINAL, **ENGINE)
    message = str(refused.value)
    assert "max_model_len 128 exceeds the model's limit of 64" in message
    assert "max_position_embeddings=64" in message and "--hf-overrides" in message


def test_hf_overrides_set_rope_scaling_on_a_plain_model(tiny_long, long_prompt, reference):
    """The plain checkpoint with ``hf_overrides`` is the linear one: same length, tokens."""
    overrides = {"rope_scaling": LINEAR}
    max_model_len, tokens = octavo_greedy(tiny_long("none"), long_prompt, hf_overrides=overrides)
    assert max_model_len == 2 * ORIGINAL
    assert_matches_reference(reference, "linear", tokens)


# ----- the derived length, as vLLM's _get_and_verify_max_len ---------------------------------
def longest(**raw):
    context = context_length_of(raw, rope_parameters_for(raw))
    return context.longest, context.default


QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"max_position_embeddings": 4096}, (4096, 4096)),
        ({"max_position_embeddings": 64, "rope_scaling": LINEAR}, (128, 128)),
        (
            {"max_position_embeddings": 64, "rope_scaling": {"type": "dynamic", "factor": 4.0}},
            (256, 256),
        ),
        # Qwen3's documented 128k: original_max_position_embeddings x factor
        ({"max_position_embeddings": 40960, "rope_scaling": QWEN3_YARN}, (131072, 131072)),
        # Llama 3.1 already names the stretched length: not multiplied again
        ({"max_position_embeddings": 131072, "rope_scaling": LLAMA3}, (131072, 131072)),
        # LongRoPE (Phi-3.5): the longest as named; the original length by default
        (
            {
                "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096,
                "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]},
            },
            (131072, 4096),
        ),
        (
            {
                "max_position_embeddings": 131072,
                "model_type": "gemma3_text",
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            },
            (131072, 131072),
        ),
        ({"n_positions": 1024}, (1024, 1024)),  # GPT-2's key
        ({"max_position_embeddings": 4096, "seq_length": 2048}, (2048, 2048)),  # the smallest
        ({"max_position_embeddings": 4096, "model_max_length": 8192}, (8192, 8192)),  # wins
        ({}, (2048, 2048)),  # none: vLLM's assumption
    ],
)
def test_longest_context_is_derived_as_vllm_does(raw, expected):
    assert longest(**raw) == expected


# ----- --hf-overrides ------------------------------------------------------------------------
def test_overrides_merge_nested_configs_and_replace_rope_settings():
    config = {
        "max_position_embeddings": 64,
        "rope_scaling": LLAMA3,
        "text_config": {"hidden_size": 8, "num_hidden_layers": 2},
    }
    overrides = {"rope_scaling": QWEN3_YARN, "text_config": {"num_hidden_layers": 4}}
    merged = apply_hf_overrides(config, overrides)
    assert merged["rope_scaling"] == QWEN3_YARN  # no leftover llama3 keys
    assert merged["text_config"] == {"hidden_size": 8, "num_hidden_layers": 4}
    assert config["text_config"]["num_hidden_layers"] == 2  # the original is untouched


def test_the_flag_takes_json_and_refuses_anything_else(capsys):
    from octavo.entrypoints.openai import options

    args = parse("--hf-overrides", '{"rope_scaling": {"rope_type": "linear", "factor": 2}}')
    engine = EngineArgs(**{o.dest: getattr(args, o.dest) for o in options.ENGINE_OPTIONS})
    assert engine.hf_overrides == {"rope_scaling": {"rope_type": "linear", "factor": 2}}
    with pytest.raises(SystemExit):
        parse("--hf-overrides", '{"rope_scaling": ')
    assert "--hf-overrides: --hf-overrides: not JSON" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--hf-overrides: expected a JSON object"):
        EngineArgs(hf_overrides="[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object \\(a dict\\), got function"):
        EngineArgs(hf_overrides=lambda config: config)
