"""Speculative decoding end to end: greedy output token-identical to no speculation (n-gram
and draft-model proposals, preemptions forced), sampled output distributed as without it
(a two-sample chi-square test), stop strings, n > 1, logprobs, and every block freed."""

from __future__ import annotations

import json
import math
from collections import Counter

import httpx
import pytest
import torch

from octavo import LLM, SamplingParams

from conftest import assert_all_blocks_free, tiny_server
from server_harness import metric_value
from tiny_models import build_tiny_model

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}
# A small KV cache and step budget: long prompts are chunked and sequences get preempted.
SQUEEZED = {
    "dtype": "float32",
    "max_model_len": 256,
    "max_num_batched_tokens": 32,
    "kv_cache_memory": 24 * 4096,
}
DRAFT_KV = 48 * 4096  # the same 24 blocks: the tiny drafts' blocks are as large as the target's
# SmolLM2 engines: room for every request here (~90 blocks of 16 tokens per model); the CPU
# default (2 GiB per engine) would only cost the time and memory of zeroing it.
SMOL = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory": 64 << 20}
SMALL_VOCAB = 1024  # the distribution test's tiny model: ids 0..1023 of the tokenizer
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def looping_prompt(length: int, seed: int, vocab_size: int = 40010) -> list[int]:
    """A prompt that repeats a 7-token pattern (so n-gram lookups find matches) of token ids
    from 10 to ``vocab_size`` - 1."""
    pattern = [(seed * 131 + i * 17) % (vocab_size - 10) + 10 for i in range(7)]
    return (pattern * (length // 7 + 1))[:length]


def mixed_prompts() -> list[list[int]]:
    return [looping_prompt(60 + 25 * i, i) for i in range(6)]


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory, smol_tokenizer):
    """A different tiny random model of the same vocabulary: a poor but valid draft."""
    folder = tmp_path_factory.mktemp("draft")
    return build_tiny_model(folder, "qwen2", smol_tokenizer, num_hidden_layers=1)


SMOL_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
SMOL_GREEDY = SamplingParams(max_tokens=24, temperature=0)
LIST_PROMPT = (
    "Copy this list exactly: apple, banana, cherry, date, elderberry, fig, grape, "
    "honeydew, kiwi, lemon.\nCopy: apple, banana,"
)
LIST_PARAMS = SamplingParams(max_tokens=30, temperature=0, stop=[" grape"], logprobs=2, n=2)


@pytest.fixture(scope="module")
def smol_plain(smol_folder) -> list:
    """SmolLM2 without speculation: the references of the SmolLM2 tests, in one batched run
    (the three greedy prompts' outputs, then the list prompt's)."""
    llm = LLM(str(smol_folder), **SMOL)
    prompts = [*SMOL_PROMPTS, LIST_PROMPT]
    params = [SMOL_GREEDY] * len(SMOL_PROMPTS) + [LIST_PARAMS]
    return llm.generate(prompts, params, use_tqdm=False)


@pytest.fixture(scope="module")
def reference(tiny_folder):
    """Greedy outputs without speculation (same squeezed engine)."""
    llm = LLM(str(tiny_folder("llama3")), **SQUEEZED)
    outputs = llm.generate(mixed_prompts(), GREEDY, use_tqdm=False)
    return [out.outputs[0].token_ids for out in outputs]


def generate_speculating(folder, speculative_config, prompts, params, **engine):
    llm = LLM(str(folder), speculative_config=speculative_config, **{**SQUEEZED, **engine})
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return llm, outputs


def test_ngram_greedy_is_token_identical_with_preemptions(tiny_folder, reference):
    llm, outputs = generate_speculating(tiny_folder("llama3"), NGRAM, mixed_prompts(), GREEDY)
    assert [out.outputs[0].token_ids for out in outputs] == reference
    counters = llm.engine.scheduler.spec_counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    assert llm.engine.stats().num_preemptions > 0, "the cache is small enough to preempt"
    assert_all_blocks_free(llm.engine)


def test_draft_model_greedy_is_token_identical_with_preemptions(
    tiny_folder, reference, draft_folder
):
    config = {"model": str(draft_folder), "num_speculative_tokens": 3}
    llm, outputs = generate_speculating(
        tiny_folder("llama3"), config, mixed_prompts(), GREEDY, kv_cache_memory=DRAFT_KV
    )
    assert [out.outputs[0].token_ids for out in outputs] == reference
    counters = llm.engine.scheduler.spec_counters
    assert counters.num_drafts > 0 and counters.num_draft_tokens > counters.num_accepted_tokens
    assert llm.engine.stats().num_preemptions > 0
    assert_all_blocks_free(llm.engine)


def test_target_drafting_for_itself_accepts_nearly_everything(tiny_folder, reference):
    folder = tiny_folder("llama3")
    config = {"model": str(folder), "num_speculative_tokens": 4}
    llm, outputs = generate_speculating(
        folder, config, mixed_prompts(), GREEDY, kv_cache_memory=DRAFT_KV
    )
    assert [out.outputs[0].token_ids for out in outputs] == reference
    counters = llm.engine.scheduler.spec_counters
    assert counters.acceptance_rate > 0.9, counters
    assert_all_blocks_free(llm.engine)


def test_smollm2_drafting_for_itself_is_token_identical(smol_folder, smol_plain):
    expected = [out.outputs[0].token_ids for out in smol_plain[: len(SMOL_PROMPTS)]]
    config = {"model": str(smol_folder), "num_speculative_tokens": 3}
    llm = LLM(str(smol_folder), speculative_config=config, **SMOL)
    outputs = llm.generate(SMOL_PROMPTS, SMOL_GREEDY, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected
    assert llm.engine.scheduler.spec_counters.acceptance_rate > 0.9
    assert_all_blocks_free(llm.engine)


def test_stop_strings_n_and_logprobs_match_no_speculation(smol_folder, smol_plain):
    """The stop string ends a verified stretch: the tokens kept after it are dropped."""
    expected = smol_plain[len(SMOL_PROMPTS)]
    llm = LLM(str(smol_folder), speculative_config=NGRAM, **SMOL)
    got = llm.generate([LIST_PROMPT], LIST_PARAMS, use_tqdm=False)[0]
    counters = llm.engine.scheduler.spec_counters
    assert counters.num_accepted_tokens >= 2 * len(got.outputs), counters
    for want, have in zip(expected.outputs, got.outputs, strict=True):
        assert have.token_ids == want.token_ids and have.text == want.text
        assert (have.finish_reason, have.stop_reason) == ("stop", " grape")
        assert [entry.token_id for entry in have.logprobs] == have.token_ids
        for a, b in zip(want.logprobs, have.logprobs, strict=True):
            assert a.top[0][0] == b.top[0][0] and a.logprob == pytest.approx(b.logprob, abs=1e-3)
    assert_all_blocks_free(llm.engine)


@pytest.fixture(scope="module")
def small_vocab_folder(tmp_path_factory, smol_tokenizer):
    """The tiny Llama-3 with 1024 of the tokenizer's ids: each draw's top-k and softmax run
    over 1024 logits, not 49152 (the sampled tokens' distribution is what is tested)."""
    folder = tmp_path_factory.mktemp("small_vocab")
    return build_tiny_model(folder, "llama3", smol_tokenizer, vocab_size=SMALL_VOCAB)


def test_sampled_tokens_are_distributed_as_without_speculation(small_vocab_folder):
    """Two-sample chi-square over the token after a speculated step, 1200 draws each."""
    folder = small_vocab_folder
    prompt = looping_prompt(28, 5, vocab_size=SMALL_VOCAB)
    params = SamplingParams(max_tokens=4, temperature=1.0, top_k=6, ignore_eos=True)

    def third_tokens(speculative_config) -> list[int]:
        torch.manual_seed(0)
        llm = LLM(
            str(folder),
            dtype="float32",
            max_model_len=128,
            kv_cache_memory=16 << 20,  # 4096 blocks: 256 running sequences fit, none preempted
            seed=7,
            speculative_config=speculative_config,
        )
        outputs = llm.generate([prompt] * 1200, params, use_tqdm=False)
        if speculative_config is not None:
            counters = llm.engine.scheduler.spec_counters
            assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens, counters
            assert_all_blocks_free(llm.engine)
        return [out.outputs[0].token_ids[2] for out in outputs]

    plain, speculated = third_tokens(None), third_tokens(NGRAM)
    statistic, dof = two_sample_chi_square(plain, speculated)
    assert statistic < chi_square_critical(dof), (statistic, dof)


def two_sample_chi_square(first: list[int], second: list[int]) -> tuple[float, int]:
    """Pearson's statistic of "same distribution" and its degrees of freedom; tokens seen
    fewer than 10 times in all are pooled into one category."""
    pooled = Counter(first + second)
    common = [token for token, count in pooled.items() if count >= 10]

    def counts(sample: list[int]) -> list[int]:
        tally = Counter(sample)
        kept = [tally[token] for token in common]
        return [*kept, len(sample) - sum(kept)]

    table = torch.tensor([counts(first), counts(second)], dtype=torch.float64)
    table = table[:, table.sum(dim=0) > 0]
    expected = table.sum(dim=1, keepdim=True) * table.sum(dim=0) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return statistic, table.shape[1] - 1


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """The chi-square quantile at 1 - 0.001 (z = 3.09), by Wilson and Hilferty's formula."""
    spread = 2 / (9 * dof)
    return dof * (1 - spread + z * math.sqrt(spread)) ** 3


def test_bad_speculative_configs_are_refused(tiny_folder, tmp_path, smol_tokenizer):
    folder = str(tiny_folder("llama3"))
    with pytest.raises(ValueError, match="method 'eagle' is not one of"):
        LLM(folder, speculative_config={"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer >= 1"):
        LLM(folder, speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    other = build_tiny_model(tmp_path / "other", "llama3", smol_tokenizer, vocab_size=1000)
    with pytest.raises(ValueError, match="vocabulary of 1000 tokens but the target has"):
        LLM(folder, speculative_config={"model": str(other), "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="a draft model runs with tensor_parallel_size"):
        LLM(
            folder,
            tensor_parallel_size=2,
            speculative_config={"model": folder, "num_speculative_tokens": 2},
        )
    with pytest.raises(ValueError, match=r"is not a folder with a config\.json"):
        LLM(folder, speculative_config={"model": str(tmp_path), "num_speculative_tokens": 2})


def test_served_stream_carries_several_tokens_per_delta_and_metrics(tiny_folder):
    """Through the real server: streamed text equals the non-streamed text, a delta holds
    every token a verification kept, and /metrics counts the proposals."""
    prompt = looping_prompt(40, 3)
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 30,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    with tiny_server(tiny_folder, "tiny", speculative_config=NGRAM, dtype="float32") as server:
        http = httpx.Client(base_url=server.url, timeout=60)
        full = http.post("/v1/completions", json=body).json()["choices"][0]
        streamed = http.post("/v1/completions", json={**body, "stream": True})
        metrics = http.get("/metrics").text
        http.close()
    events = [line.removeprefix("data: ") for line in streamed.text.split("\n\n") if line]
    chunks = [json.loads(event)["choices"][0] for event in events[:-1]]
    assert "".join(chunk["text"] for chunk in chunks) == full["text"]
    tokens_per_delta = [len(chunk["logprobs"]["tokens"]) for chunk in chunks]
    assert sum(tokens_per_delta) == 30 and max(tokens_per_delta) > 1, tokens_per_delta
    accepted = metric_value(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= metric_value(metrics, "vllm:spec_decode_num_draft_tokens_total")
    assert metric_value(metrics, "vllm:spec_decode_num_drafts_total") > 0
    assert (
        metric_value(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0")
        > 0
    )


def test_ngram_under_tensor_parallelism_is_token_identical(tiny_folder, reference):
    """Proposals come from the driver and reach every rank through the scheduler's step."""
    prompts = mixed_prompts()
    with LLM(
        str(tiny_folder("llama3")), tensor_parallel_size=2, speculative_config=NGRAM, **SQUEEZED
    ) as llm:
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [out.outputs[0].token_ids for out in outputs] == reference
        assert llm.engine.scheduler.spec_counters.num_accepted_tokens > 0


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_aborts_while_speculating_free_every_block(tiny_folder, draft_folder, steps):
    """Aborted ``steps`` steps after the first verification (prompts still being chunked,
    forks, proposals in flight)."""
    config = {"model": str(draft_folder), "num_speculative_tokens": 3}
    llm = LLM(
        str(tiny_folder("llama3")),
        speculative_config=config,
        **{**SQUEEZED, "kv_cache_memory": DRAFT_KV},
    )
    engine = llm.engine
    for index, prompt in enumerate(mixed_prompts()[:4]):
        engine.add_request(f"r{index}", prompt, SamplingParams(max_tokens=40, n=1 + index % 2))
    while engine.scheduler.spec_counters.num_drafts == 0:
        engine.step()
    for _ in range(steps):
        engine.step()
    assert engine.has_unfinished_requests()
    for index in range(4):
        engine.abort_request(f"r{index}")
    engine.step()
    assert not engine.has_unfinished_requests()
    assert_all_blocks_free(engine)
