"""Structured output inside the engine: constrained and unconstrained requests in one
batch (the unconstrained ones unchanged), preemption and ``n > 1`` forks keep the
constraint, tensor parallelism (the driver samples with the grammar), offline errors,
and the parameters' own checks."""

from __future__ import annotations

import json
import re

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.model_executor.model_config import ModelConfig
from octavo.structured_output.compiler import (
    GrammarCompileError,
    GrammarCompiler,
    choice_grammar,
)
from octavo.structured_output.params import StructuredOutputsParams

from greedy_prompts import mixed_prompts

REGEX = r"[a-f]{3}-[0-9]{2,4}"
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
}


def greedy(max_tokens: int = 24, **constraint) -> SamplingParams:
    so = StructuredOutputsParams(**constraint) if constraint else None
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=so)


@pytest.fixture(scope="module")
def llm(tiny_folder):
    return LLM(str(tiny_folder("llama3")), dtype="float32", max_model_len=256)


def test_unconstrained_requests_are_unchanged_by_constrained_neighbours(llm, smol_tokenizer):
    prompts = mixed_prompts(smol_tokenizer)[:4]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]
    mixed_params = [greedy(), greedy(regex=REGEX), greedy(), greedy(json=SCHEMA, max_tokens=40)]
    mixed = llm.generate(prompts, mixed_params, use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone[0]
    assert mixed[2].outputs[0].token_ids == alone[2]
    assert re.fullmatch(REGEX, mixed[1].outputs[0].text)
    assert set(json.loads(mixed[3].outputs[0].text)) == {"ok", "n"}


def test_preemption_and_forks_keep_the_constraint(tiny_folder, smol_tokenizer):
    folder = tiny_folder("llama3")
    block = bytes_per_block(ModelConfig.from_folder(folder), 16, torch.float32)
    prompts = mixed_prompts(smol_tokenizer)
    params = SamplingParams(
        n=2,
        temperature=0.9,
        seed=5,
        max_tokens=30,
        structured_outputs=StructuredOutputsParams(json=SCHEMA),
    )
    squeezed = LLM(
        str(folder),
        dtype="float32",
        max_model_len=384,
        kv_cache_memory=30 * block,
        max_num_batched_tokens=48,
    )
    outputs = squeezed.generate(prompts, params, use_tqdm=False)
    assert squeezed.engine.stats().num_preemptions > 0
    for output in outputs:
        for completion in output.outputs:
            assert set(json.loads(completion.text)) == {"ok", "n"}, completion.text


def test_the_driver_samples_with_the_grammar_under_tensor_parallelism(tiny_folder):
    with LLM(
        str(tiny_folder("llama3")), dtype="float32", max_model_len=128, tensor_parallel_size=2
    ) as llm:
        (output,) = llm.generate(["Hello"], greedy(regex=REGEX), use_tqdm=False)
    assert re.fullmatch(REGEX, output.outputs[0].text)


@pytest.mark.parametrize(
    ("constraint", "words"),
    [
        ({"grammar": 'root ::= "a" | undefined_rule'}, 'Rule "undefined_rule" is not defined'),
        ({"regex": "(["}, "Unclosed"),
        ({"json": {"type": "nope"}}, "nope"),
    ],
)
def test_compile_errors_name_the_problem_without_source_paths(smol_tokenizer, constraint, words):
    """xgrammar's messages start "[04:10:15] /project/cpp/grammar_parser.cc:820: ": the 400
    keeps what is wrong and drops its log time and source file positions."""
    compiler = GrammarCompiler(smol_tokenizer, len(smol_tokenizer), [0])
    with pytest.raises(GrammarCompileError) as error:
        compiler.compile(StructuredOutputsParams(**constraint))
    message = str(error.value)
    assert words in message
    assert not re.search(r"\.(cc|cpp|h|py):\d+|/project/|\[\d\d:\d\d:\d\d\]", message), message


def test_offline_bad_constraint_fails_before_anything_runs(llm):
    with pytest.raises(GrammarCompileError, match="invalid regex"):
        llm.generate(["Hi"], greedy(regex="(unclosed"), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"regex": "a", "grammar": 'root ::= "a"'}, "exactly one"),
        ({"choice": []}, "non-empty"),
        ({"choice": ["a", ""]}, "non-empty"),
    ],
)
def test_params_need_exactly_one_valid_constraint(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)


def test_schema_dicts_keep_their_key_order_and_share_a_cache_key():
    first = StructuredOutputsParams(json={"b": 1, "a": 2})
    assert first.spec == '{"b":1,"a":2}'
    assert first.cache_key() == StructuredOutputsParams(json='{"b":1,"a":2}').cache_key()


def test_choice_grammar_escapes_quotes_and_backslashes():
    assert choice_grammar(['say "hi"', "a\\b", "é"]) == 'root ::= "say \\"hi\\"" | "a\\\\b" | "é"'


def test_generation_past_the_grammar_end_keeps_to_stop_tokens(llm):
    """With ``ignore_eos`` (or ``min_tokens``) a sequence outlives its grammar: after the
    stop token only stop tokens may follow, and nothing fails (a served benchmark hit it)."""
    eos = llm.engine.scheduler.limits.eos_token_ids
    params = SamplingParams(
        temperature=0.0,
        max_tokens=8,
        ignore_eos=True,
        structured_outputs=StructuredOutputsParams(regex="ab"),
    )
    (output,) = llm.generate(["Hello"], params, use_tqdm=False)
    tokens = output.outputs[0].token_ids
    assert len(tokens) == 8 and output.outputs[0].text == "ab"
    assert set(tokens[-3:]) <= set(eos)


def test_allow_only_sets_exactly_those_bits():
    import xgrammar as xgr

    from octavo.structured_output.matcher import allow_only

    bitmask = xgr.allocate_token_bitmask(2, 100)
    allow_only(bitmask, 1, [0, 31, 33, 95])
    allowed = [t for t in range(100) if (int(bitmask[1, t // 32]) >> (t % 32)) & 1]
    assert allowed == [0, 31, 33, 95]
    assert int(bitmask[0, 0]) == -1  # other rows untouched
