"""SamplingParams: vLLM defaults, normalisation of stop lists, and validation errors."""

from __future__ import annotations

import pytest

from octavo.sampling_params import SamplingParams


def test_defaults_match_vllm() -> None:
    params = SamplingParams()
    assert (params.n, params.temperature, params.top_p, params.top_k) == (1, 1.0, 1.0, 0)
    assert (params.min_p, params.repetition_penalty) == (0.0, 1.0)
    assert (params.max_tokens, params.min_tokens, params.logprobs) == (16, 0, None)
    assert params.stop == [] and params.stop_token_ids == []
    assert params.skip_special_tokens and not params.include_stop_str_in_output
    assert not params.is_greedy and not params.any_penalty


def test_stop_is_normalised_to_a_list() -> None:
    assert SamplingParams(stop="END").stop == ["END"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]


def test_greedy_and_penalty_flags() -> None:
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=1e-6).is_greedy
    assert not SamplingParams(temperature=0.01).is_greedy
    assert SamplingParams(repetition_penalty=1.2).any_penalty
    assert SamplingParams(presence_penalty=-0.5).any_penalty
    assert SamplingParams(frequency_penalty=0.1).any_penalty


@pytest.mark.parametrize("top_k", [-1, 0, 1, 50])
def test_valid_top_k(top_k: int) -> None:
    assert SamplingParams(top_k=top_k).top_k == top_k


def test_boundary_values_are_accepted() -> None:
    SamplingParams(top_p=1.0, min_p=1.0, presence_penalty=2.0, frequency_penalty=-2.0)
    SamplingParams(max_tokens=None, min_tokens=100, logprobs=20, temperature=0.0)
    SamplingParams(max_tokens=5, min_tokens=5, logprobs=0, seed=123)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 0}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.1}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"seed": "abc"}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 2.5}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_invalid_values_raise_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_logprobs_above_the_engines_limit_are_refused_naming_it() -> None:
    """The bound is the engine's --max-logprobs (vLLM's default 20), not a constant."""
    SamplingParams(logprobs=30).check_max_logprobs(30)
    with pytest.raises(ValueError, match="logprobs of 21, which is greater than max allowed: 20"):
        SamplingParams(logprobs=21).check_max_logprobs(20)
    with pytest.raises(ValueError, match=r"prompt_logprobs of 6.*max allowed: 5"):
        SamplingParams(prompt_logprobs=6).check_max_logprobs(5)
