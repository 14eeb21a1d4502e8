"""Automatic prefix caching: reuse of full blocks across requests, same outputs as without."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams

from conftest import assert_all_blocks_free

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def prompts(smol_tokenizer) -> tuple[list[int], list[int]]:
    words = smol_tokenizer.encode(" alpha beta gamma delta epsilon zeta eta theta" * 20)
    shared = words[:48]  # exactly three blocks of 16
    first = shared + smol_tokenizer.encode(" What comes next in this list?")
    second = shared + smol_tokenizer.encode(" Which of these letters is first?")
    assert first[48] != second[48]
    return first, second


def run_pair(llm: LLM, prompts) -> list:
    return [llm.generate(prompt, GREEDY, use_tqdm=False)[0] for prompt in prompts]


def test_second_request_reuses_three_blocks(smol_folder, prompts):
    cached = LLM(str(smol_folder), dtype="float32", max_model_len=256)
    uncached = LLM(
        str(smol_folder), dtype="float32", max_model_len=256, enable_prefix_caching=False
    )
    with_cache = run_pair(cached, prompts)
    without_cache = run_pair(uncached, prompts)
    assert with_cache[0].num_cached_tokens == 0
    assert with_cache[1].num_cached_tokens == 48
    assert without_cache[1].num_cached_tokens == 0
    for a, b in zip(with_cache, without_cache, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    stats = cached.engine.stats()
    assert stats.prefix_cache_hits == 48
    assert stats.prefix_cache_queries == len(prompts[0]) + len(prompts[1])
    assert_all_blocks_free(cached.engine)


def test_identical_prompt_hits_all_but_the_last_token(smol_folder, prompts):
    llm = LLM(str(smol_folder), dtype="float32", max_model_len=256)
    prompt = prompts[0][:64]  # exactly four blocks: the fourth must be recomputed
    first, second = run_pair(llm, [prompt, prompt])
    assert second.num_cached_tokens == 48
    assert first.outputs[0].token_ids == second.outputs[0].token_ids
