"""Tools on a model whose chat template never mentions them (``--tool-prompt-fallback``).

The tiny random Llama-3 model carries SmolLM2's chat template, which ignores ``tools``:
the tool definitions go into the system message as text, earlier tool calls and results
become plain turns (``octavo.inputs.tool_prompt``), and ``tool_choice`` ``required`` and
named calls — constrained by the grammar — give valid calls through the real ``openai``
client. A template that shows tools renders exactly as before; with the fallback off a
tools request is the old 400 naming ``tools``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from octavo.entrypoints.openai.context import ServerConfig
from octavo.inputs.chat import ChatOptions, ChatTemplateError, render_chat_prompt
from octavo.inputs.tool_prompt import ToolChoice, tools_block, with_tool_prompt

from serve_args import clean_environment, parse  # noqa: F401 (an autouse fixture)
from server_harness import openai_client, served_model

MODEL = "tiny-no-tools"
# Bounded arguments: a random model would otherwise fill a free string until max_tokens.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo", "Lima"]},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
}
ROUND_TRIP = [
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
]
CALLS_TEXT = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}]'
HERMES_CALL = '<tool_call>{"name": <function name>, "arguments": <arguments object>}</tool_call>'
RESULT_TEXT = "Tool result (call id call_1, function get_weather):\n18 C and sunny"
# A template that shows tools (and tool messages) itself.
TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}{{ message.get('tool_calls') or '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A template that refuses any role but user and assistant (as Llama-2's and Mistral's do).
STRICT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('only user and assistant roles') }}{% endif %}"
    "[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}"
)


def parameters_of(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def assert_valid_call(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), parameters_of(name))


def required(parallel: bool = True) -> ToolChoice:
    return ToolChoice("required", parallel=parallel)


# ----- the rendering ----------------------------------------------------------------------
def test_the_tools_go_into_a_new_system_message_with_how_to_reply():
    messages = with_tool_prompt(ASK, TOOLS, required())
    assert [m["role"] for m in messages] == ["system", "user"]
    lines = messages[0]["content"].split("\n")
    assert lines[0] == "# Tools"
    assert [json.loads(line) for line in lines[3:5]] == [WEATHER["function"], CLOCK["function"]]
    assert lines[-1] == (
        "You must call at least one of these functions. Reply with only a JSON array of "
        'calls, each {"name": <function name>, "parameters": <arguments object>}.'
    )
    assert messages[1] == ASK[0]


@pytest.mark.parametrize(
    ("choice", "instruction"),
    [
        (ToolChoice("required", parallel=False), "exactly one of these functions"),
        (ToolChoice("named", "get_time"), 'You must call the function "get_time".'),
        (ToolChoice("auto", call_format="<tool_call>X</tool_call>"), "<tool_call>X</tool_call>"),
        (ToolChoice(), '{"name": <function name>, "arguments": <arguments object>}'),
    ],
)
def test_the_reply_instruction_follows_tool_choice(choice, instruction):
    assert instruction in tools_block(TOOLS, choice).split("\n")[-1]


def test_the_tools_are_appended_to_an_existing_system_message():
    system = {"role": "system", "content": "Be brief.", "name": "ops"}
    (merged, user) = with_tool_prompt([system, *ASK], TOOLS, required())
    assert user == ASK[0]
    block = tools_block(TOOLS, ToolChoice("required"))
    assert merged == {"role": "system", "content": f"Be brief.\n\n{block}", "name": "ops"}
    parts = [{"type": "text", "text": "Be brief."}]
    (merged, _) = with_tool_prompt([{"role": "system", "content": parts}, *ASK], TOOLS, required())
    assert merged["content"] == [*parts, {"type": "text", "text": f"\n\n{block}"}]


def test_tool_calls_and_results_become_plain_turns():
    conversation = [
        *ROUND_TRIP,
        {"role": "tool", "tool_call_id": "call_9", "content": "late"},
        {"role": "user", "content": "And in Oslo?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
    ]
    assert with_tool_prompt(conversation, None) == [
        ASK[0],
        {"role": "assistant", "content": CALLS_TEXT},
        {
            "role": "user",
            "content": f"{RESULT_TEXT}\n\nTool result (call id call_9):\nlate\n\nAnd in Oslo?",
        },
        {"role": "assistant", "content": f"Let me look.\n{CALLS_TEXT}"},
    ]


def test_a_template_that_ignores_tools_renders_them_as_text(smol_tokenizer):
    options = ChatOptions(tool_choice=required())
    prompt = render_chat_prompt(smol_tokenizer, ROUND_TRIP, tools=TOOLS, options=options)
    expected = smol_tokenizer.apply_chat_template(
        with_tool_prompt(ROUND_TRIP, TOOLS, required()), tokenize=False, add_generation_prompt=True
    )
    assert prompt.text == expected
    assert "# Tools" in prompt.text and CALLS_TEXT in prompt.text and RESULT_TEXT in prompt.text


def test_a_template_that_knows_no_tool_role_takes_the_round_trip(smol_tokenizer):
    options = ChatOptions(chat_template=STRICT_TEMPLATE)
    prompt = render_chat_prompt(smol_tokenizer, ROUND_TRIP, options=options)
    assert prompt.text == (
        f"[user] {ASK[0]['content']}\n[assistant] {CALLS_TEXT}\n[user] {RESULT_TEXT}\n"
    )
    off = ChatOptions(chat_template=STRICT_TEMPLATE, tool_prompt_fallback=False)
    with pytest.raises(ChatTemplateError, match="user and assistant"):
        render_chat_prompt(smol_tokenizer, ROUND_TRIP, options=off)


def test_a_template_that_shows_tools_renders_as_before(smol_tokenizer):
    options = ChatOptions(chat_template=TOOLS_TEMPLATE)
    for conversation, tools in ((ASK, TOOLS), (ROUND_TRIP, None), (ASK, None)):
        prompt = render_chat_prompt(smol_tokenizer, conversation, tools=tools, options=options)
        direct = smol_tokenizer.apply_chat_template(
            conversation,
            tools=list(tools) if tools else None,
            chat_template=TOOLS_TEMPLATE,
            tokenize=False,
            add_generation_prompt=True,
        )
        assert prompt.text == direct


def test_a_conversation_without_tools_renders_as_before(smol_tokenizer):
    prompt = render_chat_prompt(smol_tokenizer, ASK)
    assert prompt.text == smol_tokenizer.apply_chat_template(
        ASK, tokenize=False, add_generation_prompt=True
    )


def test_without_the_fallback_tools_are_refused_and_tool_messages_left_alone(smol_tokenizer):
    options = ChatOptions(tool_prompt_fallback=False, tool_choice=required())
    with pytest.raises(ChatTemplateError, match="does not support tools"):
        render_chat_prompt(smol_tokenizer, ASK, tools=TOOLS, options=options)
    plain = [ASK[0], {"role": "assistant", "content": "Hi", "tool_calls": [CALL]}]
    prompt = render_chat_prompt(smol_tokenizer, plain, options=options)
    assert CALLS_TEXT not in prompt.text  # the template's own rendering, as before


@pytest.mark.parametrize(
    ("choice", "parser", "expected"),
    [
        ("required", None, ToolChoice("required", None, True)),
        (
            {"type": "function", "function": {"name": "get_time"}},
            None,
            ToolChoice("named", "get_time"),
        ),
        (None, "hermes", ToolChoice("auto", call_format=HERMES_CALL)),
    ],
)
def test_the_plan_hands_the_choice_to_the_fallback_prompt(choice, parser, expected):
    from octavo.entrypoints.openai.protocol import ChatCompletionRequest
    from octavo.entrypoints.openai.tool_calls.plan import plan_tools

    body = ChatCompletionRequest(messages=ASK, tools=TOOLS, tool_choice=choice)
    plan = plan_tools(body, parser is not None, parser)
    assert plan.template_tools() == TOOLS and plan.prompt_choice() == expected


# ----- the flag ---------------------------------------------------------------------------
def test_the_flag_is_on_by_default_and_reaches_the_server_config(monkeypatch):
    from octavo.entrypoints.openai.cli import parsed_engine_args, server_config

    def config_of(*argv: str) -> ServerConfig:
        args = parse(*argv)
        return server_config(args, parsed_engine_args(args))

    assert config_of().tool_prompt_fallback is True
    assert config_of("--no-tool-prompt-fallback").tool_prompt_fallback is False
    monkeypatch.setenv("OCTAVO_TOOL_PROMPT_FALLBACK", "false")
    assert config_of().tool_prompt_fallback is False
    assert config_of("--tool-prompt-fallback").tool_prompt_fallback is True


# ----- the server, through the real openai client -----------------------------------------
def serve(tiny_folder, fallback: bool) -> Any:
    config = ServerConfig(
        served_model_names=[MODEL], model_root=MODEL, tool_prompt_fallback=fallback
    )
    return served_model(
        str(tiny_folder("llama3")), config, 1, max_model_len=1024, kv_cache_memory=16 << 20
    )


@pytest.fixture(scope="module")
def server(tiny_folder) -> Iterator[Any]:
    with serve(tiny_folder, True) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


def test_a_named_call_works_on_a_template_without_tools(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=60
    ).choices[0]
    assert reply.finish_reason == "tool_calls"
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather"
    assert_valid_call(call.function.name, call.function.arguments)


def test_required_calls_work_on_a_template_without_tools(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=200,
        temperature=0.8,
        seed=4,
    ).choices[0]
    assert reply.finish_reason == "tool_calls"
    calls = reply.message.tool_calls
    assert calls
    for call in calls:
        assert_valid_call(call.function.name, call.function.arguments)


@pytest.mark.parametrize("tools", [{}, {"tools": TOOLS, "tool_choice": "none"}])
def test_a_tool_result_round_trip_gets_an_answer(server, client, smol_tokenizer, tools):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ROUND_TRIP,
        max_tokens=6,
        extra_body={"ignore_eos": True},
        **tools,
    ).choices[0]
    assert reply.finish_reason == "length" and reply.message.content
    assert not reply.message.tool_calls
    body = {"model": MODEL, "messages": ROUND_TRIP, **tools}
    prompt = smol_tokenizer.decode(rendered_ids(server, body))
    assert CALLS_TEXT in prompt and RESULT_TEXT in prompt  # the model saw the call and result
    assert "# Tools" not in prompt  # tool_choice none: the tools are not shown


def rendered_ids(server: Any, body: dict) -> list[int]:
    """The prompt token ids the server runs for a chat ``body`` (its render endpoint)."""
    reply = httpx.post(f"{server.url}/v1/chat/completions/render", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["token_ids"]


def test_the_render_endpoint_shows_the_fallback_prompt(server, smol_tokenizer):
    body = {"model": MODEL, "messages": ROUND_TRIP, "tools": TOOLS, "tool_choice": "required"}
    options = ChatOptions(tool_choice=required())
    expected = render_chat_prompt(smol_tokenizer, ROUND_TRIP, tools=TOOLS, options=options)
    expected = expected.token_ids
    assert rendered_ids(server, body) == expected


def test_auto_still_needs_a_tool_call_parser(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4)
    assert caught.value.param == "tool_choice"
    assert "--enable-auto-tool-choice" in caught.value.message


def test_without_the_fallback_a_tools_request_is_the_old_400(tiny_folder):
    with serve(tiny_folder, False) as running:
        strict = openai_client(running)
        with pytest.raises(openai.BadRequestError) as caught:
            strict.chat.completions.create(
                model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=4
            )
    assert caught.value.param == "tools" and "support tools" in caught.value.message
