"""One request's bad data fails that request only; the engine keeps serving the others."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams

from conftest import assert_all_blocks_free

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_folder) -> LLM:
    return LLM(
        str(tiny_folder("llama3")),
        dtype="float32",
        max_model_len=128,
        max_num_batched_tokens=64,
        kv_cache_memory=64 * 4096,
    )


@pytest.fixture(scope="module")
def reference(llm) -> dict[str, list[int]]:
    """Each good request's greedy tokens when it runs with no bad neighbour."""
    outs = llm.generate([prompt(12), prompt(30, 1)], GREEDY, use_tqdm=False)
    return {"a": outs[0].outputs[0].token_ids, "b": outs[1].outputs[0].token_ids}


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 131 + i * 17) % 40000 + 10 for i in range(n)]


def run_with_bad_neighbour(llm, add_bad) -> dict[str, object]:
    """Add two good requests and a bad one (``add_bad(engine)``); run all to the end."""
    engine = llm.engine
    engine.add_request("a", prompt(12), GREEDY)
    add_bad(engine)
    engine.add_request("b", prompt(30, 1), GREEDY)
    finished = {}
    for _ in range(100):
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        if not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests()
    assert_all_blocks_free(engine)
    return finished


def assert_only_bad_failed(finished, reference, needle: str) -> None:
    bad = finished["bad"]
    assert {c.finish_reason for c in bad.outputs} == {"error"}
    assert needle in bad.error
    for name in ("a", "b"):
        assert finished[name].error is None
        assert finished[name].outputs[0].token_ids == reference[name]


def test_stop_token_id_outside_the_vocabulary_is_refused_at_admission(llm):
    vocab = llm.engine.vocab_size
    with pytest.raises(ValueError, match=r"stop_token_ids must be in \[0, "):
        llm.engine.add_request("x", "Hi", SamplingParams(min_tokens=2, stop_token_ids=[vocab]))
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=6, max_tokens=5)


@pytest.mark.parametrize("n", [1, 3])
def test_a_sampling_failure_fails_only_its_request(llm, reference, n):
    def add_bad(engine):
        params = SamplingParams(n=n, seed=7, min_tokens=3, max_tokens=8)
        engine.add_request("bad", prompt(20, 2), params)
        params.stop_token_ids = [engine.vocab_size + 7]  # past admission: breaks the sampler

    finished = run_with_bad_neighbour(llm, add_bad)
    assert len(finished["bad"].outputs) == n
    assert_only_bad_failed(finished, reference, "token ids to block")


def test_a_forward_failure_fails_only_its_request(llm, reference):
    def add_bad(engine):
        engine.add_request("bad", prompt(20, 2), GREEDY)
        seq = engine.requests["bad"].seqs[0]
        seq.token_ids[5] = engine.vocab_size + 100  # past admission: breaks the embedding

    finished = run_with_bad_neighbour(llm, add_bad)
    assert_only_bad_failed(finished, reference, "IndexError")


def test_a_detokenizer_failure_fails_only_its_request(llm, reference):
    def add_bad(engine):
        engine.add_request("bad", prompt(20, 2), GREEDY)

        def broken(token: int) -> str | None:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

        engine.requests["bad"].texts[0].detokenizer.update = broken

    finished = run_with_bad_neighbour(llm, add_bad)
    assert_only_bad_failed(finished, reference, "UnicodeDecodeError")


def test_several_bad_requests_in_one_step_fail_and_the_engine_lives(llm, reference):
    def add_bad(engine):
        for name in ("bad", "bad2"):
            params = SamplingParams(min_tokens=2, max_tokens=8)
            engine.add_request(name, prompt(20, 2), params)
            params.stop_token_ids = [engine.vocab_size + 7]

    finished = run_with_bad_neighbour(llm, add_bad)
    assert finished["bad2"].error is not None
    assert_only_bad_failed(finished, reference, "token ids to block")


def test_when_every_request_fails_alone_a_canary_step_clears_the_engine(llm):
    engine = llm.engine
    for name in ("x", "y"):
        params = SamplingParams(min_tokens=2, max_tokens=8)
        engine.add_request(name, prompt(20, 2), params)
        params.stop_token_ids = [engine.vocab_size + 7]
    outputs = engine.step()
    assert sorted(o.request_id for o in outputs if o.error) == ["x", "y"]
    assert not engine.has_unfinished_requests()
    assert_all_blocks_free(engine)
    (out,) = llm.generate(prompt(12), GREEDY, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


def test_a_failure_no_request_explains_is_raised(llm, monkeypatch):
    engine = llm.engine
    engine.add_request("a", prompt(12), GREEDY)
    engine.add_request("b", prompt(30, 1), GREEDY)

    def broken(*args, **kwargs):
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(runner_of(engine).paged, "run", broken)  # the forward pass fails
    monkeypatch.setattr(runner_of(engine), "graphs", None)  # a cached prompt's step decodes
    with pytest.raises(RuntimeError, match="the device is gone"):
        engine.step()
    monkeypatch.undo()
    _abort_all(engine)


def test_out_of_memory_is_an_engine_error(llm, monkeypatch):
    engine = llm.engine
    engine.add_request("a", prompt(12), GREEDY)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("no memory left")

    monkeypatch.setattr(runner_of(engine).sampler, "launch", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        engine.step()
    monkeypatch.undo()
    _abort_all(engine)


def runner_of(engine):
    """The model runner behind the engine's in-process executor."""
    return engine.executor.worker.runner


def _abort_all(engine) -> None:
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    engine.step()
    assert_all_blocks_free(engine)
