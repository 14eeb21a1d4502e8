"""``--async-scheduling``: each step planned while the previous one runs, token for token
the same as steps run in turn (greedy, seeded sampling with penalties and logprobs,
stop strings, ``n > 1``, preemption, aborts)."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.scheduler.output import IN_FLIGHT_TOKEN

PROMPTS = [[11, 12, 13], [21, 22, 23, 24, 25, 26, 27], [31, 32], [41, 42, 43, 44, 45]]


def _engine(folder, overlapped: bool, **kwargs) -> LLM:
    return LLM(
        str(folder),
        device="cpu",
        dtype="float32",
        max_model_len=128,
        async_scheduling=overlapped,
        **kwargs,
    )


@pytest.fixture(scope="module")
def engines(tiny_folder):
    folder = tiny_folder("llama3")
    pair = {overlapped: _engine(folder, overlapped) for overlapped in (False, True)}
    yield pair
    for llm in pair.values():
        llm.shutdown()


def _completions(llm: LLM, params: list[SamplingParams] | SamplingParams, prompts=PROMPTS):
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [
        [(c.token_ids, c.text, c.finish_reason, c.logprobs) for c in out.outputs] for out in outputs
    ]


def test_greedy_and_sampled_steps_equal_steps_in_turn(engines):
    assert engines[True].engine.scheduler.overlapped
    greedy = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (9, 4, 1, 6)]
    sampled = SamplingParams(
        temperature=0.9,
        top_p=0.9,
        top_k=40,
        seed=3,
        max_tokens=12,
        logprobs=2,
        presence_penalty=0.5,
        repetition_penalty=1.2,
        min_tokens=3,
    )
    for params in (greedy, sampled):
        assert _completions(engines[True], params) == _completions(engines[False], params)


def test_stop_strings_and_forks_equal_steps_in_turn(engines):
    text = engines[False].generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=12))
    stop = text[0].outputs[0].text[3:6]  # stops mid-generation: the next token is discarded
    assert stop
    params = [
        SamplingParams(temperature=0, max_tokens=12, stop=[stop]),
        SamplingParams(temperature=0.8, seed=5, n=3, max_tokens=7),
    ]
    prompts = PROMPTS[:2]
    overlapped = _completions(engines[True], params, prompts)
    assert overlapped == _completions(engines[False], params, prompts)
    assert overlapped[0][0][2] == "stop"
    assert len(overlapped[1]) == 3


def test_preempted_sequences_equal_steps_in_turn(tiny_folder):
    """A KV cache of 10 blocks for 6 sequences growing to 46 tokens: sequences are
    preempted (some while a token is in flight) and recomputed."""
    prompts = [[100 + 7 * i + j for j in range(10)] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=36, ignore_eos=True)
    results, preemptions = {}, {}
    for overlapped in (False, True):
        llm = _engine(tiny_folder("llama3"), overlapped, kv_cache_memory=10 * 4096)
        results[overlapped] = _completions(llm, params, prompts)
        preemptions[overlapped] = llm.engine.scheduler.counters.preemptions
        llm.shutdown()
    assert preemptions[True] > 0 and preemptions[False] > 0
    assert results[True] == results[False]


def test_an_abort_leaves_the_other_requests_as_in_turn(engines):
    def run(llm: LLM) -> dict[str, list[int]]:
        engine = llm.engine
        params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
        for index, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{index}", prompt, params)
        done, steps = {}, 0
        while engine.has_unfinished_requests():
            steps += 1
            if steps == 4:
                engine.abort_request("r1")
            for output in engine.step():
                if output.finished:
                    done[output.request_id] = list(output.outputs[0].token_ids)
        return done

    overlapped, in_turn = run(engines[True]), run(engines[False])
    aborted = overlapped.pop("r1"), in_turn.pop("r1")
    assert overlapped == in_turn
    assert all(len(tokens) == 10 for tokens in overlapped.values())
    # the aborted request reports the tokens its engine had finished when it was aborted:
    # one step fewer with a step in flight
    assert 0 < len(aborted[0]) < 10 and aborted[0] == aborted[1][: len(aborted[0])]


def test_a_decode_planned_ahead_takes_the_token_in_flight(engines):
    """The overlapped scheduler plans a decode whose input is still being sampled."""
    scheduler = engines[True].engine.scheduler
    seen = []
    original = scheduler.schedule

    def spy():
        out = original()
        seen.extend(s.token_ids for s in out.decodes)
        return out

    scheduler.schedule = spy
    try:
        engines[True].generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=5))
    finally:
        scheduler.schedule = original
    assert [IN_FLIGHT_TOKEN] in seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the overlap needs a CUDA GPU")
def test_on_a_gpu_overlapped_graphed_steps_equal_steps_in_turn(tiny_folder):
    """Launched steps, in-flight tokens filled on the device, decode graphs replayed."""
    common = dict(
        device="cuda",
        dtype="float32",
        max_model_len=128,
        max_num_seqs=8,
        gpu_memory_utilization=0.2,
    )
    results = {}
    for overlapped in (False, True):
        llm = LLM(str(tiny_folder("llama3")), async_scheduling=overlapped, **common)
        assert llm.engine.executor.worker.runner.graphs is not None
        greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=16, logprobs=1)
        results[overlapped] = [_completions(llm, p) for p in (greedy, sampled)]
        llm.shutdown()
    assert results[True] == results[False]
