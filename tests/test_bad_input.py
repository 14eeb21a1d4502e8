"""Bad input raises a clear ValueError at the door, never a crash deep inside."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.config import EngineArgs


@pytest.fixture(scope="module")
def llm(tiny_folder) -> LLM:
    return LLM(str(tiny_folder("qwen2")), dtype="float32", max_model_len=64, kv_cache_memory=2**20)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "prompt must not be empty"),
        ([], "prompts? must not be empty"),
        ([1] * 64, "max_model_len"),
        ([10**9], "token ids"),
    ],
)
def test_bad_prompts(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, SamplingParams(), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
    ],
)
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_unknown_model_path(tmp_path):
    with pytest.raises(ValueError, match=r"not a folder with a config\.json"):
        LLM(str(tmp_path / "nope"))


def test_hub_uri_is_refused_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="not in the local Hugging Face cache"):
        LLM("hf://meta-llama/Llama-3-8B")


def test_unsupported_uri_scheme_is_refused():
    with pytest.raises(ValueError, match="unsupported scheme"):
        LLM("s3://bucket/Llama-3-8B")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_size": 12}, "block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory"),
        ({"dtype": "int8"}, "dtype"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
    ],
)
def test_bad_engine_args(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**kwargs)


def test_unknown_engine_argument_is_named():
    with pytest.raises(ValueError, match="max_num_sequences"):
        LLM(None, max_num_sequences=3)


def test_kv_cache_too_small_for_max_model_len(tiny_folder):
    with pytest.raises(ValueError, match="fewer than max_model_len"):
        LLM(str(tiny_folder("qwen2")), max_model_len=2048, kv_cache_memory=8192 * 4)


def test_mismatched_params_list(llm):
    with pytest.raises(ValueError, match="sampling params for"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)
