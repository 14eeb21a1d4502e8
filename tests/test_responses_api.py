"""The Responses API (``/v1/responses``) through the real openai client against a served
tiny Qwen2 whose chat template shows tools Hermes-style and opens a ``<think>`` block
when ``reasoning.effort`` is given (the server runs the ``qwen3`` reasoning parser).

Prompts are checked against the chat render endpoint: a Responses request must run
exactly the prompt of the equivalent chat request (instructions, earlier turns, tools).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from octavo.entrypoints.openai.context import ServerConfig

from server_harness import ThreadedServer, openai_client, served_model
from tiny_models import build_tiny_model

MODEL = "tiny-responses"
TEMPLATE = """\
{%- if tools %}<|im_start|>system
Tools you may call:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}{% set f = call.function %}
<tool_call>{{ {"name": f.name, "arguments": f.arguments} | tojson }}</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if reasoning_effort %}<think>
{% else %}<think>

</think>

{% endif %}{% endif %}"""
# Bounded values: a random model would otherwise fill a free string until the limit.
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": CITY,
}
NAMED = {"type": "function", "name": "get_weather"}
CITY_FORMAT = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory, smol_folder) -> Iterator[ThreadedServer]:
    tokenizer = AutoTokenizer.from_pretrained(smol_folder)
    tokenizer.chat_template = TEMPLATE
    folder = build_tiny_model(tmp_path_factory.mktemp("responses"), "qwen2", tokenizer)
    config = ServerConfig(
        served_model_names=[MODEL],
        model_root=MODEL,
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        reasoning_parser="qwen3",
    )
    with served_model(
        str(folder), config, 1, max_model_len=1024, kv_cache_memory=16 << 20
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


def rendered_length(server: ThreadedServer, messages: list[dict], **fields) -> int:
    """How many tokens the equivalent chat request's prompt has (the render endpoint)."""
    body = {"model": MODEL, "messages": messages, **fields}
    reply = httpx.post(f"{server.url}/v1/chat/completions/render", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return len(reply.json()["token_ids"])


def test_a_plain_response(client, server):
    response = client.responses.create(
        model=MODEL, input="Say hello", instructions="Be brief.", max_output_tokens=6
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text
    usage = response.usage
    assert 1 <= usage.output_tokens <= 6
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    asked = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]
    assert usage.input_tokens == rendered_length(server, asked)
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"


def stream_events(client, **fields) -> list:
    return list(client.responses.create(model=MODEL, stream=True, **fields))


def test_a_streamed_response_arrives_in_order_and_reassembles(client):
    events = stream_events(client, input="Which city?", text=CITY_FORMAT, max_output_tokens=40)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    final = events[-1].response
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == final.output_text == events[-4].text
    jsonschema.validate(json.loads(text), CITY)
    assert final.status == "completed" and final.usage.output_tokens > 0


def test_the_sdk_stream_helper_assembles_the_final_response(client):
    with client.responses.stream(model=MODEL, input="Which city?", text=CITY_FORMAT) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text
    jsonschema.validate(json.loads(final.output_text), CITY)


@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_text_format_constrains_the_output(client, kind):
    text = CITY_FORMAT if kind == "json_schema" else {"format": {"type": "json_object"}}
    response = client.responses.create(
        model=MODEL, input="Which city? Answer in JSON.", text=text, max_output_tokens=60
    )
    if kind == "json_schema":
        assert response.status == "completed"
        jsonschema.validate(json.loads(response.output_text), CITY)
    elif response.status == "completed":  # free JSON may still be cut by the limit
        assert isinstance(json.loads(response.output_text), dict)
    assert response.text.format.type == kind


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_a_function_tool_is_called_with_valid_arguments(client, tool_choice):
    response = client.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice=tool_choice,
        max_output_tokens=80,
        parallel_tool_calls=False,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and response.status == "completed"
    (call,) = calls
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), CITY)


def test_a_streamed_function_call_assembles(client):
    events = stream_events(client, input="Weather?", tools=[WEATHER], tool_choice=NAMED)
    kinds = [event.type for event in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (call,) = events[-1].response.output
    assert "".join(deltas) == events[-3].arguments == call.arguments
    jsonschema.validate(json.loads(call.arguments), CITY)
    with client.responses.stream(
        model=MODEL, input="Weather?", tools=[WEATHER], tool_choice=NAMED
    ) as stream:
        (call,) = stream.get_final_response().output
    jsonschema.validate(json.loads(call.arguments), CITY)


def test_a_function_call_output_round_trip(client, server):
    first = client.responses.create(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER], tool_choice=NAMED
    )
    (call,) = first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[result],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=5,
    )
    assert second.output[0].type == "message"
    turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"},
    ]
    assert second.usage.input_tokens == rendered_length(server, turns)


def test_the_same_round_trip_with_the_items_sent_back(client, server):
    first = client.responses.create(
        model=MODEL,
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    results = [
        {"type": "function_call_output", "call_id": c.call_id, "output": "Rain"} for c in calls
    ]
    items = [{"role": "user", "content": "Weather in Oslo?"}, *[c.model_dump() for c in calls]]
    second = client.responses.create(
        model=MODEL, input=items + results, tools=[WEATHER], tool_choice=NAMED, store=False
    )
    assert second.output[0].type == "function_call"


def test_previous_response_id_continues_the_conversation(client, server):
    first = client.responses.create(
        model=MODEL, input="Hello there", instructions="Be brief.", max_output_tokens=5
    )
    second = client.responses.create(
        model=MODEL, input="And again", previous_response_id=first.id, max_output_tokens=5
    )
    assert second.previous_response_id == first.id
    turns = [  # the first request's instructions are not carried over (as OpenAI)
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And again"},
    ]
    assert second.usage.input_tokens == rendered_length(server, turns)
    assert second.usage.input_tokens > first.usage.input_tokens
    # The same conversation sent back as items (the SDK's output objects) runs the same.
    items = [turns[0], *[item.model_dump() for item in first.output], turns[2]]
    third = client.responses.create(model=MODEL, input=items, max_output_tokens=5)
    assert third.usage.input_tokens == second.usage.input_tokens


def test_auto_tool_choice_reads_calls_out_of_free_text(client):
    response = client.responses.create(
        model=MODEL, input="Weather?", tools=[WEATHER], max_output_tokens=8
    )
    assert response.tool_choice == "auto" and response.output
    assert {item.type for item in response.output} <= {"message", "function_call"}


def test_reasoning_becomes_a_reasoning_item(client):
    response = client.responses.create(
        model=MODEL, input="Think first", reasoning={"effort": "low"}, max_output_tokens=8
    )
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content[0].type == "reasoning_text"
    assert reasoning.content[0].text
    assert 0 < response.usage.output_tokens_details.reasoning_tokens <= 8


def test_streamed_reasoning_events(client):
    events = stream_events(client, input="Think", reasoning={"effort": "low"}, max_output_tokens=8)
    kinds = [event.type for event in events]
    assert events[2].item.type == "reasoning" and "response.reasoning_text.delta" in kinds
    assert kinds[-1] == "response.incomplete" or kinds[-1] == "response.completed"
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert final.output[0].content[0].text == deltas


def test_retrieve_and_delete(client):
    created = client.responses.create(model=MODEL, input="Keep me", max_output_tokens=3)
    fetched = client.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text
    assert fetched.usage == created.usage
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.retrieve(created.id, stream=True)
    assert error.value.body["param"] == "stream"
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


def test_store_false_is_not_kept(client):
    created = client.responses.create(
        model=MODEL, input="Forget me", max_output_tokens=3, store=False
    )
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=MODEL, input="Hi", previous_response_id=created.id)
    assert error.value.body["param"] == "previous_response_id"


def test_cancel_is_only_for_background_responses(server, client):
    created = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    reply = httpx.post(f"{server.url}/v1/responses/{created.id}/cancel", timeout=30)
    assert reply.status_code == 400
    missing = httpx.post(f"{server.url}/v1/responses/resp_nope/cancel", timeout=30)
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "web_search"),
        (
            {"tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["v"]}]},
            "tools[1].type",
            "file_search",
        ),
        (
            {"input": [{"type": "image_generation_call", "id": "x"}]},
            "input[0].type",
            "image_generation_call",
        ),
        (  # a text-only model: the chat path's 400 (test_vision_media_urls for vision)
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input",
            "text-only",
        ),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role", "robot"),
        ({"input": []}, "input", "at least one"),
        ({"input": ["hi"]}, "input", "JSON objects"),
        ({"input": [{"role": "user"}]}, "input[0].content", "content"),
        ({"input": [{"role": "user", "content": [5]}]}, "input[0].content[0].type", "None"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id", "call_id"),
        (
            {
                "input": [
                    {"type": "function_call_output", "call_id": "c", "output": [{"type": "x"}]}
                ]
            },
            "input[0].output[0].type",
            "'x'",
        ),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": 5}]},
            "tools[0].parameters",
            "dictionary",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools", "distinct"),
        ({"tool_choice": NAMED}, "tool_choice", "needs tools"),
        ({"text": {"format": "json"}}, "text.format.type", "None"),
        ({"tool_choice": 5, "tools": [WEATHER]}, "tool_choice", "tool_choice must be"),
        ({"max_output_tokens": 0}, "max_output_tokens", "greater than or equal"),
        ({"temperature": 3}, "temperature", "less than or equal"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "yaml"),
        ({"text": {"format": {"type": "json_schema", "schema": CITY}}}, "text.format.name", "name"),
        (
            {"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]},
            "tool_choice",
            "nope",
        ),
        ({"tool_choice": {"type": "file_search"}, "tools": [WEATHER]}, "tool_choice", ""),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name", ""),
        ({"background": True}, "background", "background"),
        ({"extra_body": {"surprise": 1}}, "surprise", "not permitted"),
        ({"previous_response_id": "resp_unknown"}, "previous_response_id", "not found"),
        # Echoed and stored with the response: bounded as OpenAI bounds them.
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16 pairs"),
        ({"metadata": {"k" * 65: "v"}}, "metadata", "64 characters"),
        ({"metadata": {"k": "v" * 513}}, "metadata", "512 characters"),
        ({"user": "u" * 257}, "user", "256"),
        ({"safety_identifier": "s" * 65}, "safety_identifier", "64"),
        ({"text": {"format": {"type": "text"}, "padding": "x"}}, "text", "padding"),
        ({"text": {"format": {"type": "json_object", "junk": "x"}}}, "text", "junk"),
        ({"text": {"verbosity": "x" * 1000}}, "text", "verbosity"),
        ({"reasoning": {"effort": "low", "notes": "x"}}, "reasoning", "notes"),
        ({"reasoning": {"effort": "x" * 1000}}, "reasoning", "reasoning.effort"),
        ({"tools": [{**WEATHER, "padding": "x" * 100}]}, "tools[0].padding", "padding"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(client, fields, param, words):
    body = {"model": MODEL, "input": "Hi", **fields}
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(**body)
    assert error.value.body["param"] == param
    assert words in error.value.body["message"]


def test_a_prefill_for_a_remote_decode_is_not_streamed_and_misses_an_earlier_turn_with_503(client):
    """P/D: a prefill pod never stored the decode pod's earlier turn, so an unknown
    previous_response_id is a 503 there (the llm-d sidecar then decodes the whole request
    on its decode pod; a 4xx would reach the client)."""
    prefill = {"kv_transfer_params": {"do_remote_decode": True}}
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=MODEL, input="Hi", stream=True, extra_body=prefill)
    assert "stream false" in error.value.body["message"]
    unknown = {"previous_response_id": "resp_on_a_decode_pod"}
    with pytest.raises(openai.InternalServerError) as error:
        client.with_options(max_retries=0).responses.create(
            model=MODEL, input="Hi", extra_body=prefill, **unknown
        )
    assert error.value.status_code == 503 and "prefill server" in error.value.body["message"]


def test_the_store_is_bounded_in_bytes_too(monkeypatch):
    """100 responses of 7.5 MiB each once took the server from 794 to 1573 MiB: the store
    now forgets the least recently used past OCTAVO_RESPONSES_STORE_BYTES as well."""
    from octavo.entrypoints.openai.protocol import ChatMessage
    from octavo.entrypoints.openai.responses_api.objects import ResponseObject
    from octavo.entrypoints.openai.responses_api.store import (
        DEFAULT_STORE_BYTES,
        STORE_BYTES_ENV,
        ResponseStore,
        StoredResponse,
        store_bytes_from_env,
    )

    def entry(text: str) -> StoredResponse:
        response = ResponseObject(status="completed", model=MODEL, instructions=text)
        return StoredResponse(response, [ChatMessage(role="user", content=text)])

    size = entry("x" * 10_000).size()
    assert 20_000 < size < 21_000, "the response and its conversation, as JSON"
    store = ResponseStore(capacity=100, max_bytes=3 * size)
    entries = [entry("x" * 10_000) for _ in range(5)]
    for item in entries:
        store.put(item)
    assert len(store) == 3 and store.num_bytes == 3 * size <= store.max_bytes
    kept = [store.get(e.response.id) is not None for e in entries]
    assert kept == [False, False, True, True, True]
    store.put(entry("y" * 100_000))  # larger than the whole bound: not kept, evicts nothing
    assert len(store) == 3 and store.num_bytes == 3 * size
    assert store.delete(entries[0].response.id) is False
    assert store.delete(entries[4].response.id) is True and store.num_bytes == 2 * size
    assert store_bytes_from_env() == DEFAULT_STORE_BYTES == 256 * 1024 * 1024
    monkeypatch.setenv(STORE_BYTES_ENV, "1048576")
    assert store_bytes_from_env() == 1 << 20
    monkeypatch.setenv(STORE_BYTES_ENV, "-1")
    with pytest.raises(ValueError, match=STORE_BYTES_ENV):
        store_bytes_from_env()


def test_the_store_forgets_the_least_recently_used_past_its_bound(monkeypatch):
    from octavo.entrypoints.openai.responses_api.objects import ResponseObject
    from octavo.entrypoints.openai.responses_api.store import (
        DEFAULT_STORE_SIZE,
        STORE_SIZE,
        STORE_SIZE_ENV,
        ResponseStore,
        StoredResponse,
        store_size_from_env,
    )

    def entry() -> StoredResponse:
        return StoredResponse(ResponseObject(status="completed", model=MODEL), [])

    store = ResponseStore(capacity=2)
    first, second, third = entry(), entry(), entry()
    store.put(first)
    store.put(second)
    assert store.get(first.response.id) is first  # now the most recently used
    store.put(third)
    assert store.get(second.response.id) is None and len(store) == 2
    assert store.get(first.response.id) is first and store.get(third.response.id) is third
    monkeypatch.setenv(STORE_SIZE_ENV, "3")
    assert store_size_from_env() == 3
    monkeypatch.delenv(STORE_SIZE_ENV)
    assert store_size_from_env() == DEFAULT_STORE_SIZE
    assert ResponseStore().capacity == STORE_SIZE  # read once, when the server starts
    monkeypatch.setenv(STORE_SIZE_ENV, "0")
    with pytest.raises(ValueError, match=STORE_SIZE_ENV):
        store_size_from_env()


def parsed_events(frames: list[str]) -> list:
    """Each ``event:``/``data:`` frame validated against the openai SDK's event types."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(ResponseStreamEvent)
    events = []
    for frame in frames:
        kind_line, data_line = frame.strip().split("\n")
        payload = json.loads(data_line.removeprefix("data: "))
        assert kind_line == f"event: {payload['type']}"
        events.append(adapter.validate_python(payload))
    return events


def test_reasoning_text_and_calls_stream_as_validated_sdk_events():
    """Every item kind in one stream, each event strictly valid for the SDK, the items
    opened and closed in turn, the final response valid as ``openai.types.responses``."""
    from openai.types.responses import Response

    from octavo.entrypoints.openai.responses import DeltaFunction, DeltaMessage, DeltaToolCall
    from octavo.entrypoints.openai.responses_api.events import ResponseEvents
    from octavo.entrypoints.openai.responses_api.objects import ResponseObject, ResponseUsage

    def call(index: int, arguments: str, name: str | None = None) -> DeltaMessage:
        first = {"id": f"call_{index}", "type": "function"} if name else {}
        function = DeltaFunction(name=name, arguments=arguments)
        return DeltaMessage(tool_calls=[DeltaToolCall(index=index, function=function, **first)])

    events = ResponseEvents(ResponseObject(status="in_progress", model=MODEL))
    frames = events.start()
    for delta in [
        DeltaMessage(reasoning="Let me "),
        DeltaMessage(reasoning="think."),
        DeltaMessage(content="Calling"),
        call(0, '{"city": ', "get_weather"),
        call(0, '"Paris"}'),
        call(1, '{"city": "Oslo"}', "get_weather"),
    ]:
        frames += events.delta(delta)
    frames += events.finish(ResponseUsage.of(10, 7, 0, 2), cut_short=False)
    parsed = parsed_events(frames)
    assert [event.sequence_number for event in parsed] == list(range(len(parsed)))
    added = [e.item.type for e in parsed if e.type == "response.output_item.added"]
    done = [e.item.type for e in parsed if e.type == "response.output_item.done"]
    assert added == done == ["reasoning", "message", "function_call", "function_call"]
    final = Response.model_validate(parsed[-1].response.model_dump())
    assert final.status == "completed" and final.output_text == "Calling"
    assert final.output[0].content[0].text == "Let me think."
    assert [item.arguments for item in final.output[2:]] == [
        '{"city": "Paris"}',
        '{"city": "Oslo"}',
    ]
    assert final.usage.total_tokens == 17


def test_a_whole_response_validates_against_the_sdk_type(client, server):
    from openai.types.responses import Response

    created = client.responses.create(
        model=MODEL, input="Hi", tools=[WEATHER], tool_choice=NAMED, max_output_tokens=60
    )
    raw = httpx.get(f"{server.url}/v1/responses/{created.id}", timeout=30).json()
    assert Response.model_validate(raw).output[0].type == "function_call"


def test_input_items_are_listed_in_pages(client):
    items = [
        {"role": "user", "content": "One"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Two"}]},
        {"role": "user", "content": "Three"},
    ]
    created = client.responses.create(model=MODEL, input=items, max_output_tokens=2)
    listed = client.responses.input_items.list(created.id)
    assert [item.content[0].text for item in listed.data] == ["Three", "Two", "One"]
    assert all(item.id.startswith("msg_") and item.type == "message" for item in listed.data)
    first = client.responses.input_items.list(created.id, order="asc", limit=2)
    assert [item.content[0].text for item in first.data] == ["One", "Two"] and first.has_more
    rest = client.responses.input_items.list(created.id, order="asc", after=first.last_id)
    assert [item.content[0].text for item in rest.data] == ["Three"] and not rest.has_more
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_unknown")
