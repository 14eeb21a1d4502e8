"""Sampling features end to end through the engine (SmolLM2, fp32)."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams

from conftest import assert_all_blocks_free


@pytest.fixture(scope="module")
def llm(smol_folder) -> LLM:
    # 64 MiB of KV (~1400 tokens) holds every request here; the CPU default (2 GiB) would
    # only cost the time and memory of zeroing it
    return LLM(str(smol_folder), dtype="float32", max_model_len=512, kv_cache_memory=64 << 20)


@pytest.fixture(scope="module")
def question(llm) -> str:
    messages = [{"role": "user", "content": "Write a short story about a robot."}]
    tokenizer = llm.get_tokenizer()
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def tokens(outputs) -> list[list[int]]:
    return [c.token_ids for out in outputs for c in out.outputs]


def test_same_seed_same_tokens_whatever_the_batch(llm, question):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=7, max_tokens=16)
    alone = tokens(llm.generate(question, seeded, use_tqdm=False))
    other = SamplingParams(temperature=1.0, max_tokens=16)
    different = SamplingParams(temperature=1.0, top_p=0.95, seed=8, max_tokens=16)
    # one batched run: the seeded request beside others, and another seed on the same prompt
    batched = llm.generate(
        [question + " Hi.", question, question], [other, seeded, different], use_tqdm=False
    )
    assert tokens(batched[1:2]) == alone
    assert tokens(batched[2:]) != alone


def test_top_k_one_equals_greedy(llm, question):
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    top1 = SamplingParams(temperature=1.3, top_k=1, seed=3, max_tokens=16)
    # both in one batched run: the same prompt, greedy and sampled with top_k=1
    greedy_out, top1_out = llm.generate([question, question], [greedy, top1], use_tqdm=False)
    assert tokens([top1_out]) == tokens([greedy_out])


def test_stop_string_is_trimmed(llm, question):
    full = llm.generate(question, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    text = full[0].outputs[0].text
    stop = text.split()[3]  # a word from the middle of the greedy answer
    (out,) = llm.generate(
        question, SamplingParams(temperature=0.0, max_tokens=24, stop=[stop]), use_tqdm=False
    )
    completion = out.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop
    assert completion.text == text[: text.index(stop)]
    assert stop not in completion.text


def test_min_tokens_holds_off_eos(llm):
    greeting = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    short = llm.generate(greeting, SamplingParams(temperature=0.0, max_tokens=64), use_tqdm=False)
    natural = len(short[0].outputs[0].token_ids)
    assert short[0].outputs[0].finish_reason == "stop" and natural < 40
    params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=natural + 10)
    (out,) = llm.generate(greeting, params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) >= natural + 10


def test_n_three_completions_share_the_prompt_blocks(llm, question):
    engine = llm.engine
    engine.add_request("n3", question, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8))
    while len(engine.requests["n3"].seqs) < 3:
        engine.step()
    seqs = engine.requests["n3"].seqs
    full_prompt_blocks = len(seqs[0].prompt_token_ids) // engine.kv.block_size
    tables = [engine.kv.block_ids(seq.seq_id)[:full_prompt_blocks] for seq in seqs]
    assert tables[0] == tables[1] == tables[2] and full_prompt_blocks > 0
    assert all(engine.kv.pool.blocks[b].ref_count == 3 for b in tables[0])
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [out for out in engine.step() if out.finished]
    (out,) = outputs
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 8 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    assert_all_blocks_free(engine)


def test_logprobs_with_alternatives(llm, question):
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=3)
    (out,) = llm.generate(question, params, use_tqdm=False)
    completion = out.outputs[0]
    assert len(completion.logprobs) == 4
    for token, entry in zip(completion.token_ids, completion.logprobs, strict=True):
        assert entry.token_id == token and entry.rank == 1 and len(entry.top) == 3
        assert entry.top[0][0] == token and entry.logprob <= 0.0
    assert completion.cumulative_logprob == pytest.approx(
        sum(e.logprob for e in completion.logprobs)
    )


def test_chat_helper_applies_the_template(llm):
    (out,) = llm.chat(
        [{"role": "user", "content": "hi"}], SamplingParams(temperature=0.0), use_tqdm=False
    )
    assert out.prompt.startswith("<|im_start|>") and out.outputs[0].text


def test_the_engine_seed_makes_unseeded_sampling_repeatable(tiny_folder):
    """``--seed`` seeds the global RNG that requests without a seed of their own draw from."""
    unseeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)

    def run(seed: int) -> list[int]:
        engine = LLM(
            str(tiny_folder("llama3")),
            dtype="float32",
            max_model_len=64,
            kv_cache_memory=1 << 20,
            seed=seed,
        )
        return tokens(engine.generate([11, 12, 13], unseeded, use_tqdm=False))

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_num_threads_sets_the_engines_cpu_threads(tiny_folder):
    import torch

    before = torch.get_num_threads()
    try:
        LLM(
            str(tiny_folder("llama3")),
            dtype="float32",
            max_model_len=64,
            kv_cache_memory=1 << 20,
            num_threads=1,
        )
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
