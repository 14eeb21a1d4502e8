"""Property: no request, however odd its prompt or sampling parameters, takes the engine down.

Hypothesis draws sampling parameters (in and out of their valid ranges, stop token ids
past the vocabulary, min_tokens above max_tokens, ...) and prompts (text, token ids,
empty, too long). Each case is either refused with ``ValueError`` at the door, or runs
to a normal end; meanwhile a well-formed neighbour request keeps being served, and
afterwards every KV block is back in the pool.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from octavo import LLM, SamplingParams

from conftest import assert_all_blocks_free

MAX_MODEL_LEN = 48
VOCAB = 49152  # the tiny models share SmolLM2's tokenizer
NEIGHBOUR = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_folder) -> LLM:
    return LLM(
        str(tiny_folder("qwen2")),
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=32,
        max_num_seqs=8,
        kv_cache_memory=48 * 2048,
    )


def mostly(valid, invalid):
    """Valid values seven times in eight, so that many drawn requests get to run."""
    return st.one_of(*[valid] * 7, invalid)


def number(low: float, high: float):
    valid = st.floats(low, high, allow_nan=False, width=32)
    return mostly(valid, st.floats(allow_nan=True, allow_infinity=True, width=32))


outside_vocab = st.sampled_from([-2, -1, VOCAB, VOCAB + 1, 2**31])
token_id = mostly(st.integers(0, VOCAB - 1), outside_vocab)
sampling_fields = st.fixed_dictionaries(
    {},
    optional={
        "n": mostly(st.integers(1, 3), st.integers(-1, 0)),
        "temperature": number(0.0, 3.0),
        "top_p": number(0.0625, 1.0),
        "top_k": st.integers(-2, VOCAB + 5),
        "min_p": number(0.0, 1.0),
        "presence_penalty": number(-2.0, 2.0),
        "frequency_penalty": number(-2.0, 2.0),
        "repetition_penalty": number(0.0625, 3.0),
        "seed": st.none() | st.integers(-(2**63), 2**64),
        "stop": st.none() | st.text(max_size=4) | st.lists(st.text(max_size=3), max_size=3),
        "stop_token_ids": st.none() | st.lists(token_id, max_size=4),
        "max_tokens": mostly(st.integers(1, 2 * MAX_MODEL_LEN), st.none() | st.integers(-1, 0)),
        "min_tokens": mostly(st.integers(0, 4), st.integers(-1, 2 * MAX_MODEL_LEN)),
        "ignore_eos": st.booleans(),
        "logprobs": mostly(st.none() | st.integers(0, 20), st.integers(-1, 25)),
        "skip_special_tokens": st.booleans(),
        "include_stop_str_in_output": st.booleans(),
    },
)
prompts = mostly(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=MAX_MODEL_LEN // 2),
    st.text(max_size=60) | st.lists(token_id, max_size=MAX_MODEL_LEN + 4),
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fields=sampling_fields, prompt=prompts)
@example(fields={"max_tokens": 5, "min_tokens": 2, "stop_token_ids": [VOCAB]}, prompt="Hi")
def test_the_engine_survives_any_request(llm, fields, prompt):
    engine = llm.engine
    engine.add_request("neighbour", [11, 12, 13, 14], NEIGHBOUR)
    admitted = _admit(engine, fields, prompt)
    event("admitted" if admitted else "refused at the door")
    finished = _run_to_the_end(engine)
    assert finished["neighbour"].outputs[0].token_ids.__len__() == NEIGHBOUR.max_tokens
    for output in finished.values():
        assert output.error is None, output.error
        assert {c.finish_reason for c in output.outputs} <= {"stop", "length"}
    assert admitted == ("case" in finished)
    assert_all_blocks_free(engine)


def _admit(engine, fields: dict, prompt) -> bool:
    """Add the drawn request; False when it is refused at the door (a clean 400)."""
    try:
        params = SamplingParams(**fields)
        engine.add_request("case", prompt, params)
    except ValueError:
        return False
    return True


def _run_to_the_end(engine) -> dict:
    finished = {}
    for _ in range(400):
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        if not engine.has_unfinished_requests():
            return finished
    pytest.fail("requests still running after 400 steps")
