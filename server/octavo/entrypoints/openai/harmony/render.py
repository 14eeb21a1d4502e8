"""A chat conversation as a gpt-oss prompt, rendered by ``openai-harmony`` (as vLLM does).

- a system message (the encoding's defaults, ``Reasoning: <effort>`` from the request's
  ``reasoning_effort`` or ``chat_template_kwargs.reasoning_effort``, today's date; the
  ``commentary`` channel only when there are tools);
- one developer message when there are instructions or tools: the request's system and
  developer messages as its instructions, the tools as the ``functions`` namespace;
- user messages; assistant messages as their reasoning sent back (``reasoning`` or
  ``reasoning_content``: an ``analysis`` message), their ``final`` content and one
  ``commentary`` message per tool call (``to=functions.NAME``, JSON arguments); tool
  results as messages from ``functions.NAME`` (named by the call they answer) to the
  assistant; reasoning before the last ``final`` message is dropped (it was spent on that
  answer, as vLLM and Harmony's own renderer drop it);
- ending in ``<|start|>assistant``: the reply begins with its first header.
"""

from __future__ import annotations

import datetime
from typing import Any

from openai_harmony import (
    Author,
    ChannelConfig,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
)

from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.harmony.encoding import harmony_encoding
from octavo.entrypoints.openai.prompts import check_text_fits, render_chat
from octavo.entrypoints.openai.protocol import ChatMessage
from octavo.inputs.chat import ChatOptions
from octavo.multimodal.processor import ProcessedPrompt

EFFORTS = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}
INSTRUCTION_ROLES = ("system", "developer")


def render_harmony(
    messages: list[ChatMessage],
    info: EngineInfo,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    options: ChatOptions | None = None,
) -> list[int] | ProcessedPrompt:
    """``render_chat``'s signature: the prompt's token ids (the chat template's where the
    encoding cannot be loaded). A conversation too long for any prompt is a 400 before
    it is rendered, as on the template path."""
    check_text_fits("".join(message.text() for message in messages), info, "messages")
    encoding = harmony_encoding()
    if encoding is None:
        return render_chat(messages, info, add_generation_prompt, tools, options)
    effort = (options.template_kwargs if options else {}).get("reasoning_effort")
    today = datetime.date.today().isoformat()
    conversation = harmony_conversation(messages, tools, effort, today)
    return encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)


def harmony_conversation(
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    effort: str | None,
    start_date: str,
) -> Conversation:
    instructions = "\n\n".join(m.text() for m in messages if m.role in INSTRUCTION_ROLES)
    header = [system_message(effort, start_date, bool(tools))]
    developer = developer_message(instructions, tools)
    if developer is not None:
        header.append(developer)
    turns = [m for m in messages if m.role not in INSTRUCTION_ROLES]
    return Conversation.from_messages([*header, *without_spent_analysis(turn_messages(turns))])


def system_message(effort: str | None, start_date: str, with_tools: bool) -> Message:
    content = SystemContent.new().with_conversation_start_date(start_date)
    if effort in EFFORTS:
        content = content.with_reasoning_effort(EFFORTS[effort])
    if not with_tools:  # no functions to call: no commentary channel (as vLLM)
        channels = content.channel_config.valid_channels
        kept = [channel for channel in channels if channel != "commentary"]
        content = content.with_channel_config(ChannelConfig.require_channels(kept))
    return Message.from_role_and_content(Role.SYSTEM, content)


def developer_message(instructions: str, tools: list[dict[str, Any]] | None) -> Message | None:
    if not instructions and not tools:
        return None
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions(instructions)
    if tools:
        content = content.with_function_tools([_tool_description(tool) for tool in tools])
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _tool_description(tool: dict[str, Any]) -> ToolDescription:
    function = tool["function"]
    return ToolDescription.new(
        function["name"], function.get("description") or "", function.get("parameters")
    )


def turn_messages(turns: list[ChatMessage]) -> list[Message]:
    """The conversation's turns; a tool result is named by its ``name``, else by the call
    it answers."""
    call_names: dict[str, str] = {}
    rendered: list[Message] = []
    for message in turns:
        if message.role == "assistant":
            for call in message.tool_calls or []:
                call_names[call.id] = call.function.name
            rendered += _assistant_messages(message)
        elif message.role == "tool":
            name = message.name or call_names.get(message.tool_call_id or "", "unknown")
            author = Author.new(Role.TOOL, f"functions.{name}")
            result = Message.from_author_and_content(author, message.text())
            rendered.append(result.with_channel("commentary").with_recipient("assistant"))
        else:
            rendered.append(Message.from_role_and_content(Role.USER, message.text()))
    return rendered


def _assistant_messages(message: ChatMessage) -> list[Message]:
    rendered = []
    reasoning = message.reasoning or message.reasoning_content
    if reasoning:
        thought = Message.from_role_and_content(Role.ASSISTANT, reasoning)
        rendered.append(thought.with_channel("analysis"))
    if message.text():
        final = Message.from_role_and_content(Role.ASSISTANT, message.text())
        rendered.append(final.with_channel("final"))
    for call in message.tool_calls or []:
        request = Message.from_role_and_content(Role.ASSISTANT, call.function.arguments)
        request = request.with_channel("commentary").with_recipient(
            f"functions.{call.function.name}"
        )
        rendered.append(request.with_content_type("json"))
    return rendered


def without_spent_analysis(messages: list[Message]) -> list[Message]:
    """The ``analysis`` messages before the last ``final`` one left out."""
    finals = [i for i, message in enumerate(messages) if message.channel == "final"]
    if not finals:
        return messages
    return [m for i, m in enumerate(messages) if i > finals[-1] or m.channel != "analysis"]
