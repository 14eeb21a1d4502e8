"""Structured output through the real openai client against a served SmolLM2: JSON schemas
(nested objects, enums, arrays with min/max items, integer bounds, string patterns),
JSON object mode, regex, choice and EBNF grammars, on chat and completions, greedy,
sampled and streamed, the client's pydantic ``parse`` helper, metrics, and bad input."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import Mock

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from octavo.entrypoints.openai.app import context_of
from octavo.entrypoints.openai.context import ServerConfig
from octavo.structured_output.params import StructuredOutputsParams

from server_harness import ThreadedServer, metric_value, openai_client, served_model

MODEL = "smol"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
SCHEMAS = {
    "nested-object": {
        "type": "object",
        "properties": {
            "user": PERSON,
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
            },
        },
        "required": ["user", "address"],
    },
    "array-min-max-items": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "enum": ["red", "green", "blue"]},
                "minItems": 2,
                "maxItems": 3,
            },
        },
        "required": ["tags"],
    },
    "integer-bounds": {
        "type": "object",
        "properties": {
            "count": {"type": "integer", "minimum": -5, "maximum": 5},
            "ratio": {"type": "number"},
        },
        "required": ["count", "ratio"],
    },
    "string-pattern": {
        "type": "object",
        "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
        "required": ["sku"],
    },
}
QUESTION = [{"role": "user", "content": "Give me an example record as JSON."}]


# The module's server runs this dtype (not the one ``auto`` picks here); it is also the
# bfloat16 server of ``dtype_client``.
SERVER_DTYPE = "bfloat16"


@pytest.fixture(scope="module")
def server(smol_folder) -> Iterator[ThreadedServer]:
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    with served_model(
        str(smol_folder),
        config,
        2,
        max_model_len=1024,
        kv_cache_memory=64 << 20,
        dtype=SERVER_DTYPE,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


def chat(client, **kwargs) -> str:
    kwargs = {"model": MODEL, "messages": QUESTION, "max_tokens": 200, **kwargs}
    return client.chat.completions.create(**kwargs).choices[0].message.content


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_json_schema_output_parses_and_validates(client, name, temperature):
    schema = SCHEMAS[name]
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    text = chat(client, response_format=response_format, temperature=temperature, seed=3)
    jsonschema.validate(json.loads(text), schema)


def test_guided_json_and_structured_outputs_spellings(client):
    schema = SCHEMAS["string-pattern"]
    for extra in ({"guided_json": schema}, {"structured_outputs": {"json": schema}}):
        jsonschema.validate(json.loads(chat(client, extra_body=extra)), schema)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def dtype_client(request, smol_folder) -> Iterator[openai.OpenAI]:
    """A client of SmolLM2 served in the given dtype (not the one ``auto`` picks here):
    the module's server for its dtype, one more server for the other."""
    if request.param == SERVER_DTYPE:
        yield openai_client(request.getfixturevalue("server"))
        return
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    with served_model(
        str(smol_folder),
        config,
        2,
        max_model_len=512,
        kv_cache_memory=32 << 20,
        dtype=request.param,
    ) as running:
        yield openai_client(running)


@pytest.fixture(scope="module")
def json_object_matcher(smol_tokenizer):
    """A fresh xgrammar matcher of the JSON-object grammar, per call."""
    import xgrammar as xgr

    from octavo.structured_output.compiler import GrammarCompiler

    tokenizer = smol_tokenizer
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    compiled = compiler.compile(StructuredOutputsParams(json_object=True))
    return lambda: xgr.GrammarMatcher(compiled)


@pytest.mark.parametrize("max_tokens", [12, 120])
def test_json_object_mode(dtype_client, json_object_matcher, max_tokens):
    """What the mode promises, whatever the dtype: a reply that stopped is a JSON object;
    one cut by ``max_tokens`` (the model may write a longer object) is a prefix of one."""
    reply = dtype_client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=max_tokens,
        response_format={"type": "json_object"},
    ).choices[0]
    text = reply.message.content
    assert reply.finish_reason in ("stop", "length")
    if reply.finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.startswith("{") and json_object_matcher().accept_string(text), text


def test_regex_choice_and_grammar(client):
    regex = r"[0-9]{3}-[a-z]{2,6}"
    assert re.fullmatch(regex, chat(client, extra_body={"guided_regex": regex}))
    choices = ["yes", "no", "it depends"]
    assert chat(client, extra_body={"guided_choice": choices}) in choices
    grammar = 'root ::= "(" item ("," item)? ")"\nitem ::= [a-c] [a-c]?'  # bounded length
    text = chat(client, extra_body={"guided_grammar": grammar}, max_tokens=40, temperature=0.8)
    assert re.fullmatch(r"\([a-c]{1,2}(,[a-c]{1,2})?\)", text), text
    choice = chat(client, extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert choice in ("left", "right")


def test_completions_endpoint_is_constrained_too(client):
    schema = SCHEMAS["array-min-max-items"]
    completion = client.completions.create(
        model=MODEL, prompt="Colors as JSON:", max_tokens=80, extra_body={"guided_json": schema}
    )
    jsonschema.validate(json.loads(completion.choices[0].text), schema)
    regex = client.completions.create(
        model=MODEL, prompt="A code:", max_tokens=20, extra_body={"guided_regex": "[A-F]{4}"}
    )
    assert re.fullmatch("[A-F]{4}", regex.choices[0].text)


def test_streamed_deltas_concatenate_to_valid_json(client):
    schema = SCHEMAS["nested-object"]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=200,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) > 3
    jsonschema.validate(json.loads("".join(pieces)), schema)


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=18, le=99)
    role: str


def test_pydantic_parse_helper(client):
    """Greedy: sampled at the API's default temperature 1.0, the unbounded ``role`` string
    can run past any token limit (seen: 120 tokens of random letters)."""
    completion = client.chat.completions.parse(
        model=MODEL, messages=QUESTION, max_tokens=120, response_format=Person, temperature=0
    )
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and 18 <= person.age <= 99


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"guided_json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
            "invalid JSON schema",
        ),
        ({"guided_json": "{not json"}, "not JSON"),
        ({"guided_regex": "([a-z"}, "invalid regex"),
        ({"guided_grammar": "root ::= undefined_rule"}, "invalid grammar"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "only one of"),
        ({"guided_choice": []}, "non-empty"),
        ({"structured_outputs": {"json": {}, "regex": "a"}}, "exactly one"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ],
)
def test_bad_constraints_are_400_naming_the_problem(server, extra, message):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 5, **extra}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]


def test_metrics_count_constrained_requests_and_compile_time(client, server):
    chat(client, extra_body={"guided_regex": "[xyz]{5}"}, max_tokens=10)
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert metric_value(text, "octavo:structured_output_requests_total", kind="regex") >= 1
    assert metric_value(text, "octavo:grammar_compile_seconds_count") >= 1
    assert metric_value(text, "octavo:grammar_requests_compiling") == 0  # none waits now


def test_a_constraint_that_does_not_compile_in_time_is_a_400(server, monkeypatch):
    """The compile runs in a compile process with a deadline; past it the request is refused
    and the engine never sees it (the deadline is shrunk here instead of writing a huge
    schema)."""
    monkeypatch.setattr(context_of(server.app).grammars, "timeout", 0.0)
    properties = {f"p{i}": {"type": "string", "pattern": f"^x{i}[a-z]+$"} for i in range(60)}
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 5, "guided_json": schema}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "did not compile within" in response.json()["error"]["message"]
    assert context_of(server.app).engine.num_open == 0


def oversized_constraints(entries: int) -> list[dict]:
    """The five slow kinds of constraint: an enum, a choice, required properties, regex
    alternatives and EBNF rules, with about ``entries`` parts each."""
    properties = {f"p{i}": {"type": "string"} for i in range(entries // 4)}
    rules = "\n".join(f'r{i} ::= "x{i}" r{i + 1} | "y"' for i in range(entries // 3))
    return [
        {"guided_json": {"enum": [f"v{i}" for i in range(entries)]}},
        {"guided_choice": [f"c{i}" for i in range(entries)]},
        {"guided_json": {"type": "object", "properties": properties, "required": [*properties]}},
        {"guided_regex": "|".join(f"a{i}" for i in range(entries))},
        {"guided_grammar": f'root ::= r0\n{rules}\nr{entries // 3} ::= "z"'},
    ]


def post_chat(server, extra: dict, timeout: float = 60) -> httpx.Response:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, **extra}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout)


def test_huge_constraints_are_refused_at_once_naming_the_limit(server, monkeypatch):
    """The security probe's constraints (100k entries: megabytes) never reach a compiler:
    nothing is submitted to the compile pool (not a wall-clock bound, which a loaded
    machine breaks: parsing the megabytes alone took 5 s at a load average of 10)."""
    from octavo.structured_output.compile_pool import CompilePool

    submitted: list = []
    real_submit = CompilePool.submit

    def counting_submit(pool, params, deadline_seconds):
        submitted.append(params)
        return real_submit(pool, params, deadline_seconds)

    monkeypatch.setattr(CompilePool, "submit", counting_submit)
    for extra in oversized_constraints(100_000):
        response = post_chat(server, extra)
        assert response.status_code == 400, response.text
        assert "the limit is 262,144" in response.json()["error"]["message"]
    assert submitted == []
    fresh = {"guided_choice": [f"yes {time.monotonic_ns()}", "no"]}  # never compiled before
    assert post_chat(server, fresh).status_code == 200
    assert len(submitted) == 1  # the spy does see a compile


def test_slow_constraints_are_stopped_and_a_trivial_one_compiles_next(server, monkeypatch):
    """Five constraints under the size limit that take about a second to minutes to
    compile, sent at once: each is a 400 at the deadline (0.25 s here: on a fast, idle
    machine the EBNF one compiled within 1 s), their compile processes are killed, and a
    trivial constraint sent next compiles within 2 s (the deadline back at 1 s)."""
    grammars, info = context_of(server.app).grammars, context_of(server.app).engine.info
    assert post_chat(server, {"guided_choice": ["warm", "up"]}).status_code == 200
    monkeypatch.setattr(grammars, "timeout", 0.25)
    with ThreadPoolExecutor(5) as pool:
        slow = oversized_constraints(20_000)
        responses = list(pool.map(lambda extra: post_chat(server, extra), slow))
    for response in responses:
        assert response.status_code == 400, response.text
        assert "did not compile within 0.25 s" in response.json()["error"]["message"]
    monkeypatch.setattr(grammars, "timeout", 1.0)
    started = time.monotonic()  # the compile alone: the shared CPU may slow the generation
    asyncio.run(grammars.check(StructuredOutputsParams(choice=("yes", "no")), info, Mock()))
    assert time.monotonic() - started < 2
    assert post_chat(server, {"guided_choice": ["no", "yes"]}).status_code == 200
