"""After every scenario, every block is back in the pool with a ref count of 0."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams

from conftest import assert_all_blocks_free


@pytest.fixture(scope="module")
def llm(tiny_folder) -> LLM:
    return LLM(
        str(tiny_folder("llama3")),
        dtype="float32",
        max_model_len=256,
        max_num_batched_tokens=32,
        kv_cache_memory=40 * 4096,
    )


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 131 + i * 17) % 40000 + 10 for i in range(n)]


def test_finish(llm):
    llm.generate([prompt(20), prompt(50, 1)], SamplingParams(max_tokens=5), use_tqdm=False)
    assert_all_blocks_free(llm.engine)


def test_preemption(llm):
    outs = llm.generate(
        [prompt(100, i) for i in range(6)],
        SamplingParams(max_tokens=40, ignore_eos=True),
        use_tqdm=False,
    )
    assert all(len(out.outputs[0].token_ids) == 40 for out in outs)
    assert llm.engine.stats().num_preemptions > 0
    assert_all_blocks_free(llm.engine)


def test_n_greater_than_one(llm):
    (out,) = llm.generate(prompt(30), SamplingParams(n=3, max_tokens=6, seed=1), use_tqdm=False)
    assert len(out.outputs) == 3
    assert_all_blocks_free(llm.engine)


@pytest.mark.parametrize("steps", [0, 1, 3, 8])
def test_abort_at_any_point(llm, steps):
    engine = llm.engine
    engine.add_request("a", prompt(90), SamplingParams(n=2, max_tokens=50, ignore_eos=True))
    engine.add_request("b", prompt(10, 3), SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(steps):  # 90 tokens at 32 a step: mid-prefill, then decoding
        engine.step()
    engine.abort_request("a")
    engine.abort_request("b")
    outputs = engine.step()
    assert {out.request_id for out in outputs} == {"a", "b"}
    assert all(c.finish_reason == "abort" for out in outputs for c in out.outputs)
    assert len(next(out for out in outputs if out.request_id == "a").outputs) == 2
    assert not engine.has_unfinished_requests()
    assert_all_blocks_free(engine)
