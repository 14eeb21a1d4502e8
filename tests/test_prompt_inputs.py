"""One chat rendering and one token-range rule for ``LLM.chat`` and the server.

A Llama-3-style tokenizer adds a BOS token when it encodes, and its chat template writes
``{{ bos_token }}`` too. Encoding the rendered conversation with special tokens on gives
such a model two BOS tokens; SmolLM2 adds none, so only a tokenizer that adds one shows it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers.processors import TemplateProcessing

from octavo import LLM, SamplingParams
from octavo.entrypoints.openai.context import ServerConfig
from octavo.inputs.chat import ChatTemplateError, render_chat_prompt
from octavo.inputs.token_range import check_prompt_token_ids, prompt_token_limit

from server_harness import ThreadedServer, build_local_app, torch_threads
from tiny_models import build_tiny_model

BOS = "<|begin_of_text|>"
MODEL = "bos-tiny"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]
ENGINE_ARGS = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory": 8 << 20}


def bos_adding_tokenizer(smol_tokenizer: Any) -> Any:
    """SmolLM2's tokenizer, made to prepend a BOS on every encode, as Llama-3's does."""
    tokenizer = copy.deepcopy(smol_tokenizer)
    tokenizer.add_special_tokens({"bos_token": BOS})
    bos_id = tokenizer.convert_tokens_to_ids(BOS)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tokenizer.chat_template = "{{ bos_token }}" + smol_tokenizer.chat_template
    return tokenizer


@pytest.fixture(scope="module")
def bos_tokenizer(smol_tokenizer) -> Any:
    tokenizer = bos_adding_tokenizer(smol_tokenizer)
    assert tokenizer.encode("hi")[0] == tokenizer.bos_token_id  # it does add one
    return tokenizer


@pytest.fixture(scope="module")
def bos_folder(tmp_path_factory, bos_tokenizer, smol_folder) -> Path:
    """A tiny random Llama-3 whose tokenizer adds a BOS."""
    return build_tiny_model(tmp_path_factory.mktemp(MODEL), "llama3", bos_tokenizer)


@pytest.fixture(scope="module")
def expected_ids(bos_tokenizer) -> list[int]:
    """Hugging Face's own answer: the template rendered and tokenized in one call."""
    encoded = bos_tokenizer.apply_chat_template(
        MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=True
    )
    ids = list(encoded["input_ids"])
    assert ids.count(bos_tokenizer.bos_token_id) == 1 and ids[0] == bos_tokenizer.bos_token_id
    return ids


def test_render_chat_prompt_matches_hugging_face(bos_tokenizer, expected_ids):
    prompt = render_chat_prompt(bos_tokenizer, MESSAGES)
    assert prompt.token_ids == expected_ids
    assert prompt.text.startswith(BOS + "<|im_start|>system")


def test_render_chat_prompt_reports_template_failures(bos_tokenizer):
    no_template = copy.deepcopy(bos_tokenizer)
    no_template.chat_template = None
    with pytest.raises(ChatTemplateError, match="could not apply the chat template"):
        render_chat_prompt(no_template, MESSAGES)
    refused: list[str] = []
    with pytest.raises(ValueError, match="too long"):
        render_chat_prompt(bos_tokenizer, MESSAGES, check_text=_refuse_into(refused))
    assert refused and refused[0].startswith(BOS)


def _refuse_into(seen: list[str]) -> Any:
    def refuse(text: str) -> None:
        seen.append(text)
        raise ValueError("too long")

    return refuse


def test_offline_chat_sends_one_bos(bos_folder, bos_tokenizer, expected_ids):
    llm = LLM(str(bos_folder), **ENGINE_ARGS)
    params = SamplingParams(temperature=0, max_tokens=2)
    (output,) = llm.chat(MESSAGES, params, use_tqdm=False)
    assert output.prompt_token_ids == expected_ids
    assert output.prompt == bos_tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )


@pytest.fixture(scope="module")
def served(bos_folder) -> Iterator[tuple[str, list[list[int]]]]:
    """The server for the BOS model, and the prompt token ids its engine was given."""
    engine_prompts: list[list[int]] = []

    def record_prompts(engine: Any) -> None:
        add_request = engine.add_request

        def recording(request_id: str, prompt: Any, *args: Any, **kwargs: Any) -> None:
            engine_prompts.append(list(prompt))
            add_request(request_id, prompt, *args, **kwargs)

        engine.add_request = recording

    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    app = build_local_app(str(bos_folder), config, on_engine=record_prompts, **ENGINE_ARGS)
    with torch_threads(1), ThreadedServer(app) as server:
        server.wait_ready()
        yield server.url, engine_prompts


def test_served_chat_sends_one_bos(served, expected_ids):
    url, engine_prompts = served
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == len(expected_ids)
    assert engine_prompts[-1] == expected_ids
    tokenized = httpx.post(f"{url}/tokenize", json={"model": MODEL, "messages": MESSAGES})
    assert tokenized.json()["tokens"] == expected_ids


def test_the_prompt_token_limit_is_what_both_model_and_tokenizer_know():
    assert prompt_token_limit(vocab_size=100, tokenizer_size=90) == 90
    assert prompt_token_limit(vocab_size=64, tokenizer_size=70) == 64
    check_prompt_token_ids([0, 5, 89], 90)
    for bad in ([90], [-1], [3, 1000]):
        with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 90\)"):
            check_prompt_token_ids(bad, 90)


def test_the_server_refuses_prompt_ids_outside_the_limit(served, bos_tokenizer):
    url, _ = served
    limit = len(bos_tokenizer)
    body = {"model": MODEL, "prompt": [1, limit], "max_tokens": 1}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == f"prompt token ids must be in [0, {limit})"
    assert error["param"] == "prompt"


# ----- offline prompts as vLLM takes them ---------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llm(tiny_folder) -> Iterator[LLM]:
    with torch_threads(1), LLM(str(tiny_folder("llama3")), **ENGINE_ARGS) as llm:
        yield llm


GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def tokens_of(outputs: list) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


def test_offline_generate_takes_text_and_tokens_prompts(tiny_llm):
    from octavo.inputs import TextPrompt, TokensPrompt

    ids = tiny_llm.get_tokenizer().encode("Hello there")
    expected = tokens_of(tiny_llm.generate(ids, GREEDY, use_tqdm=False))
    assert tokens_of(tiny_llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)) == (
        expected
    )
    assert tokens_of(tiny_llm.generate({"prompt": "Hello there"}, GREEDY, use_tqdm=False)) == (
        expected
    )
    mixed = [TokensPrompt(prompt_token_ids=ids), TextPrompt(prompt="Hello there"), ids, "Hello"]
    outputs = tiny_llm.generate(mixed, GREEDY, use_tqdm=False)
    assert tokens_of(outputs)[:3] == expected * 3
    assert outputs[1].prompt == "Hello there" and outputs[0].prompt_token_ids == ids


@pytest.mark.parametrize(
    ("prompts", "error", "match"),
    [
        (5, TypeError, "got int"),
        (None, TypeError, "got NoneType"),
        ([1.5, 2.5], TypeError, "got float"),
        ([[1, True]], TypeError, "only integers"),
        ({"prompt_ids": [1]}, ValueError, r"unknown prompt keys \['prompt_ids'\]"),
        ({"prompt_token_ids": ["a"]}, TypeError, "prompt_token_ids must be a list of integers"),
        ({"prompt": 3}, TypeError, "'prompt' must be a string"),
        ({}, ValueError, "needs 'prompt' or 'prompt_token_ids'"),
        ({"prompt": "x", "multi_modal_data": {}}, ValueError, "text-only"),
        ([], ValueError, "must not be empty"),
    ],
)
def test_offline_generate_refuses_other_prompts_at_the_call(tiny_llm, prompts, error, match):
    with pytest.raises(error, match=match):
        tiny_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert not tiny_llm.engine.has_unfinished_requests()


def test_offline_logprobs_are_bounded_by_max_logprobs(tiny_llm):
    with pytest.raises(ValueError, match="logprobs of 21, which is greater than max allowed: 20"):
        tiny_llm.generate("x", SamplingParams(max_tokens=1, logprobs=21), use_tqdm=False)


def test_offline_chat_takes_vllms_template_fields(tiny_llm, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}<{{ m['content'] }}>{% endfor %}{{ tail }}")
    (output,) = tiny_llm.chat(
        MESSAGES,
        GREEDY,
        use_tqdm=False,
        chat_template=str(template),
        chat_template_kwargs={"tail": "!"},
    )
    assert output.prompt == "<You are terse.><Name a colour.>!"
    partial = [*MESSAGES, {"role": "assistant", "content": "Blue and"}]
    (output,) = tiny_llm.chat(
        partial, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True
    )
    assert output.prompt.endswith("<|im_start|>assistant\nBlue and")
