"""vLLM's extra request fields and the server flags that shape responses, on one served
tiny model.

The served ``ServerConfig`` is changed per test (``configured``) instead of starting a
server per flag; every ``add_request`` the engine receives is recorded, so a test sees
the prompt token ids and the ``SamplingParams`` a request really produced.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from octavo.entrypoints.openai.app import context_of
from octavo.entrypoints.openai.context import ServerConfig

from server_harness import ThreadedServer, build_local_app, torch_threads

MODEL = "tiny"
GREEDY = {"temperature": 0, "ignore_eos": True}
USER = [{"role": "user", "content": "hi"}]


class AddedRequests:
    """Records what the engine's ``add_request`` got (on the engine thread)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], Any]] = []

    def attach(self, engine: Any) -> None:
        add = engine.add_request

        def recording(request_id, prompt, params, *args, **kwargs):
            self.calls.append((request_id, list(prompt), params))
            return add(request_id, prompt, params, *args, **kwargs)

        engine.add_request = recording

    def last(self) -> tuple[str, list[int], Any]:
        return self.calls[-1]


@pytest.fixture(scope="module")
def served(tiny_folder) -> Iterator[tuple[ThreadedServer, AddedRequests]]:
    added = AddedRequests()
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    app = build_local_app(
        str(tiny_folder("llama3")),
        config,
        on_engine=added.attach,
        max_model_len=256,
        kv_cache_memory=4 << 20,
        max_num_seqs=8,
        max_logprobs=25,  # the engine's own bound; the server's (20) is what the tests change
    )
    with torch_threads(1), ThreadedServer(app) as running:
        yield running.wait_ready(), added


@pytest.fixture
def client(served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0].url, timeout=60) as http:
        yield http


@pytest.fixture
def added(served) -> AddedRequests:
    return served[1]


@pytest.fixture
def configured(served):
    """``with configured(field=value): ...`` serves with those ServerConfig fields."""
    context = context_of(served[0].app)

    @contextmanager
    def change(**fields: Any) -> Iterator[None]:
        saved = context.config
        context.config = dataclasses.replace(saved, **fields)
        context._decoder = None  # rebuilt from the config (--return-tokens-as-token-ids)
        try:
            yield
        finally:
            context.config, context._decoder = saved, None

    return change


@pytest.fixture(scope="module")
def tokenizer(served):
    return context_of(served[0].app).engine.info.tokenizer


def post(client: httpx.Client, path: str, status: int = 200, **body: Any) -> dict:
    response = client.post(path, json={"model": MODEL, **body})
    assert response.status_code == status, response.text
    return response.json()


def chat(client: httpx.Client, status: int = 200, **body: Any) -> dict:
    return post(client, "/v1/chat/completions", status, **{"messages": USER, **body})


def complete(client: httpx.Client, status: int = 200, **body: Any) -> dict:
    return post(client, "/v1/completions", status, **{"prompt": "Hello there", **body})


def stream_events(client: httpx.Client, path: str, **body: Any) -> list[dict]:
    response = client.post(path, json={"model": MODEL, "stream": True, **body})
    assert response.status_code == 200, response.text
    blocks = [b.removeprefix("data: ") for b in response.text.split("\n\n") if b]
    assert blocks[-1] == "[DONE]"
    return [json.loads(block) for block in blocks[:-1]]


# ----- request ids -----------------------------------------------------------------------
def test_request_id_field_and_header_name_the_response(client):
    assert complete(client, max_tokens=1, request_id="my-id")["id"] == "cmpl-my-id"
    assert chat(client, max_tokens=1, request_id="my-id")["id"] == "chatcmpl-my-id"
    response = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 1, "request_id": "body-id"},
        headers={"X-Request-Id": "hdr-1"},
    )
    assert response.json()["id"] == "cmpl-hdr-1"  # the header wins, as in vLLM
    events = stream_events(
        client, "/v1/chat/completions", messages=USER, max_tokens=2, request_id="s-1"
    )
    assert {event["id"] for event in events} == {"chatcmpl-s-1"}


def test_the_same_request_id_twice_at_once_serves_both(client, configured):
    import concurrent.futures

    def one(_: int) -> dict:
        return complete(client, max_tokens=8, request_id="dup", **GREEDY)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        bodies = list(pool.map(one, range(4)))
    assert {body["id"] for body in bodies} == {"cmpl-dup"}
    assert len({body["choices"][0]["text"] for body in bodies}) == 1


def test_unknown_field_is_a_400_naming_it(client):
    error = complete(client, 400, not_a_field=1)["error"]
    assert "not_a_field" in error["message"] and error["param"] == "not_a_field"


@pytest.mark.parametrize("token_ids", [[-1], [10**6]])
def test_bad_stop_token_ids_are_a_400_naming_that_field(client, token_ids):
    """-1 is refused by SamplingParams, 10**6 by the engine (outside the vocabulary): both
    once came back naming no field or ``prompt``."""
    for send in (complete, chat):
        error = send(client, 400, max_tokens=1, stop_token_ids=token_ids)["error"]
        assert error["param"] == "stop_token_ids", error
        assert "stop_token_ids" in error["message"]


def test_priority_zero_is_accepted_and_others_refused_by_name(client):
    assert complete(client, max_tokens=1, priority=0)["choices"]
    error = chat(client, 400, priority=1)["error"]
    assert error["param"] == "priority" and "priority scheduling is not enabled" in error["message"]


# ----- cache_salt ------------------------------------------------------------------------
SALTED_PROMPT = list(range(1000, 1040))  # two full blocks of 16 tokens, and 8 more


def cached_tokens(client: httpx.Client, **salt: str) -> int:
    body = complete(client, prompt=SALTED_PROMPT, max_tokens=1, **salt)
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_only_requests_with_the_same_cache_salt_share_prefix_cache_blocks(client, configured):
    with configured(enable_prompt_tokens_details=True):
        assert cached_tokens(client, cache_salt="tenant-a") == 0
        assert cached_tokens(client, cache_salt="tenant-b") == 0  # same prompt, no hit
        assert cached_tokens(client) == 0  # nor without a salt
        assert cached_tokens(client, cache_salt="tenant-a") == 32  # same salt: a hit
        assert cached_tokens(client) == 32


def test_cache_salt_reaches_the_engine_from_completions_chat_and_responses(client, added):
    complete(client, max_tokens=1, cache_salt="salt-1")
    assert added.last()[2].cache_salt == "salt-1"
    chat(client, max_tokens=1, cache_salt="salt-2")
    assert added.last()[2].cache_salt == "salt-2"
    post(client, "/v1/responses", input="hi", max_output_tokens=1, cache_salt="salt-3")
    assert added.last()[2].cache_salt == "salt-3"
    chat(client, max_tokens=1)
    assert added.last()[2].cache_salt is None


@pytest.mark.parametrize("salt", ["", "x" * 1025, 7, ["a"]])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/chat/completions", {"messages": USER}),
        ("/v1/responses", {"input": "hi"}),
    ],
)
def test_a_bad_cache_salt_is_a_400_naming_it(client, path, body, salt):
    error = post(client, path, 400, cache_salt=salt, **body)["error"]
    assert error["param"] == "cache_salt" and error["type"] == "invalid_request_error"


# ----- chat rendering --------------------------------------------------------------------
def rendered(added: AddedRequests, tokenizer: Any) -> str:
    return tokenizer.decode(added.last()[1], skip_special_tokens=False)


def test_add_generation_prompt_and_continue_final_message(client, added, tokenizer):
    chat(client, max_tokens=1)
    assert rendered(added, tokenizer).endswith("hi<|im_end|>\n<|im_start|>assistant\n")
    chat(client, max_tokens=1, add_generation_prompt=False)
    assert rendered(added, tokenizer).endswith("hi<|im_end|>\n")
    partial = [*USER, {"role": "assistant", "content": "The answer is"}]
    body = chat(
        client,
        max_tokens=1,
        messages=partial,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert rendered(added, tokenizer).endswith("<|im_start|>assistant\nThe answer is")
    assert body["choices"][0]["message"]["role"] == "assistant"
    error = chat(client, 400, messages=partial, continue_final_message=True)["error"]
    assert "add_generation_prompt" in error["message"]


TEMPLATE = "{% for m in messages %}[{{ m['role'] }}:{{ m['content'] }}]{% endfor %}{{ tail }}"


def test_chat_template_flag_and_chat_template_kwargs(client, added, tokenizer, configured):
    with configured(chat_template=TEMPLATE):
        chat(client, max_tokens=1, chat_template_kwargs={"tail": "<go>"})
        assert rendered(added, tokenizer) == "[user:hi]<go>"
        chat(client, max_tokens=1)
        assert rendered(added, tokenizer) == "[user:hi]"
    error = chat(client, 400, chat_template_kwargs={"add_generation_prompt": False})["error"]
    assert "add_generation_prompt" in error["message"]


def test_tokenize_renders_messages_with_the_chat_template_flag(client, tokenizer, configured):
    with configured(chat_template=TEMPLATE):
        tokens = post(client, "/tokenize", messages=USER)["tokens"]
    assert tokenizer.decode(tokens) == "[user:hi]"


def test_response_role(client, configured):
    with configured(response_role="bot"):
        assert chat(client, max_tokens=1)["choices"][0]["message"]["role"] == "bot"
        events = stream_events(client, "/v1/chat/completions", messages=USER, max_tokens=1)
        assert events[0]["choices"][0]["delta"]["role"] == "bot"
        # no new message is started: the response continues the last message's role
        body = chat(client, max_tokens=1, add_generation_prompt=False)
        assert body["choices"][0]["message"]["role"] == "user"


# ----- sampling fields -------------------------------------------------------------------
SAMPLING_FIELDS = {
    "top_k": 5,
    "min_p": 0.05,
    "repetition_penalty": 1.3,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_vllm_sampling_fields_reach_the_engine(client, added, path):
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": USER}
    post(client, path, max_tokens=2, **body, **SAMPLING_FIELDS)
    params = added.last()[2]
    assert {name: getattr(params, name) for name in SAMPLING_FIELDS} == SAMPLING_FIELDS


def test_include_stop_str_in_output(client):
    text = complete(client, max_tokens=12, **GREEDY)["choices"][0]["text"]
    stop = text[3:6]
    assert stop.strip(), f"the greedy text {text!r} has no usable stop string"
    cut = complete(client, max_tokens=12, stop=stop, **GREEDY)["choices"][0]["text"]
    kept = complete(client, max_tokens=12, stop=stop, include_stop_str_in_output=True, **GREEDY)[
        "choices"
    ][0]["text"]
    assert cut == text[: text.index(stop)] and kept == cut + stop


def test_generation_config_defaults_fill_what_the_request_leaves_out(client, added, configured):
    defaults = {"temperature": 0.0, "top_k": 7, "max_tokens": 3}
    with configured(sampling_defaults=defaults):
        body = complete(client, ignore_eos=True)
        assert body["usage"]["completion_tokens"] == 3
        params = added.last()[2]
        assert (params.temperature, params.top_k, params.max_tokens) == (0.0, 7, 3)
        assert chat(client, ignore_eos=True)["usage"]["completion_tokens"] == 3
        complete(client, ignore_eos=True, max_tokens=5, top_k=2, temperature=0.5)
        params = added.last()[2]
        assert (params.temperature, params.top_k, params.max_tokens) == (0.5, 2, 5)
    complete(client, ignore_eos=True)
    assert (added.last()[2].top_k, added.last()[2].max_tokens) == (0, 16)  # OpenAI's 16


# ----- logprobs ----------------------------------------------------------------------------
def test_max_logprobs_bounds_every_kind_of_logprobs(client, configured):
    error = complete(client, 400, max_tokens=1, logprobs=21)["error"]
    assert "max allowed: 20" in error["message"] and error["param"] == "logprobs"
    with configured(max_logprobs=3):
        assert complete(client, max_tokens=1, logprobs=3)["choices"][0]["logprobs"]
        error = complete(client, 400, max_tokens=1, logprobs=4, echo=True)["error"]
        assert "logprobs of 4, which is greater than max allowed: 3" in error["message"]
        error = chat(client, 400, max_tokens=1, logprobs=True, top_logprobs=4)["error"]
        assert error["param"] == "top_logprobs" and "max allowed: 3" in error["message"]
    with configured(max_logprobs=25):
        top = complete(client, max_tokens=1, logprobs=25)["choices"][0]["logprobs"]
        assert len(top["top_logprobs"][0]) >= 25


LABEL = re.compile(r"token_id:(\d+)")


def test_return_tokens_as_token_ids(client, tokenizer, configured):
    with configured(return_tokens_as_token_ids=True):
        body = complete(client, max_tokens=4, logprobs=2, **GREEDY)
        logprobs = body["choices"][0]["logprobs"]
        ids = [int(LABEL.fullmatch(token).group(1)) for token in logprobs["tokens"]]
        assert tokenizer.decode(ids) == body["choices"][0]["text"]
        assert all(LABEL.fullmatch(key) for top in logprobs["top_logprobs"] for key in top)
        content = chat(client, max_tokens=3, logprobs=True, top_logprobs=1, **GREEDY)
        entries = content["choices"][0]["logprobs"]["content"]
        assert all(LABEL.fullmatch(entry["token"]) for entry in entries)
        assert all(LABEL.fullmatch(alt["token"]) for e in entries for alt in e["top_logprobs"])
    plain = complete(client, max_tokens=4, logprobs=2, **GREEDY)["choices"][0]["logprobs"]
    assert not any(LABEL.fullmatch(token) for token in plain["tokens"])


# ----- usage -------------------------------------------------------------------------------
LONG_PROMPT = " ".join(f"word{i}" for i in range(60))  # several KV blocks of 16 tokens


def test_prompt_tokens_details_report_prefix_cache_hits(client, configured):
    assert "prompt_tokens_details" not in complete(client, max_tokens=1)["usage"]
    with configured(enable_prompt_tokens_details=True):
        first = complete(client, prompt=LONG_PROMPT, max_tokens=1)["usage"]
        again = complete(client, prompt=LONG_PROMPT, max_tokens=1)["usage"]
        assert first["prompt_tokens_details"] == {"cached_tokens": 0}
        cached = again["prompt_tokens_details"]["cached_tokens"]
        assert 16 <= cached < again["prompt_tokens"] and cached % 16 == 0
        events = stream_events(
            client,
            "/v1/completions",
            prompt=LONG_PROMPT,
            max_tokens=1,
            stream_options={"include_usage": True},
        )
        assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
        messages = [{"role": "user", "content": LONG_PROMPT}]
        chat(client, messages=messages, max_tokens=1)
        usage = chat(client, messages=messages, max_tokens=1)["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 16


# ----- request logging, unknown models ---------------------------------------------------
def test_request_log_lines_only_when_enabled(client, configured, caplog):
    caplog.set_level(logging.INFO, logger="octavo.requests")
    complete(client, max_tokens=1, request_id="quiet")
    assert not [r for r in caplog.records if r.name == "octavo.requests"]
    with configured(enable_log_requests=True):
        complete(client, max_tokens=1, request_id="loud")
    lines = [r.getMessage() for r in caplog.records if r.name == "octavo.requests"]
    assert len(lines) == 2 and lines[0].startswith("Received request cmpl-loud")
    assert "prompt_token_ids: [" in lines[0] and "max_tokens=1" in lines[0]
    assert lines[1].startswith("Finished request cmpl-loud") and "1 completion tokens" in lines[1]


def test_unknown_model_404_names_only_what_was_asked(client):
    error = complete(client, 404, model="gpt-4o")["error"]
    assert error["message"] == "The model `gpt-4o` does not exist."
    assert MODEL not in error["message"] and error["code"] == "model_not_found"


SLOW_PIECES = {1: "<a>", 2: "<b>", 3: "x"}


class SlowTokenizer:
    """A decode-only (slow, Python) tokenizer: like Hugging Face's, it joins added tokens
    with spaces unless ``spaces_between_special_tokens`` is false."""

    def decode(self, ids, skip_special_tokens=True, spaces_between_special_tokens=True, **_):
        words = [SLOW_PIECES[i] for i in ids if not (skip_special_tokens and i != 3)]
        return (" " if spaces_between_special_tokens else "").join(words)


@pytest.mark.parametrize(("spaces", "text"), [(True, "<a> <b> x"), (False, "<a><b>x")])
def test_spaces_between_special_tokens_reach_a_slow_tokenizers_decode(spaces, text):
    from octavo.engine.detokenizer import IncrementalDetokenizer
    from octavo.sampling_params import SamplingParams

    params = SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=spaces)
    detokenizer = IncrementalDetokenizer(SlowTokenizer(), [], params)
    for token in (1, 2, 3):
        detokenizer.update(token)
    assert detokenizer.output_text == text
