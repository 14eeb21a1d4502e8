"""A conversation as prompt token ids: the one chat rendering of ``LLM.chat`` and the server.

The chat template already writes every special token the model expects (Llama-3's
starts with ``{{ bos_token }}``), so its text is encoded *without* adding special tokens
again — exactly what ``tokenizer.apply_chat_template(..., tokenize=True)`` produces.
Encoding it with them on would give such models two BOS tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octavo.inputs.encoding import encode_texts
from octavo.inputs.tool_prompt import AUTO, ToolChoice, has_tool_messages, with_tool_prompt

Message = dict[str, Any]
JINJA_MARKS = ("{{", "{%", "\n")  # a --chat-template holding any of these is inline text


class ChatTemplateError(ValueError):
    """The tokenizer's chat template could not render the conversation."""


@dataclass(frozen=True)
class ChatOptions:
    """How a conversation is rendered besides its messages (vLLM's request fields)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None  # None: the tokenizer's own
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    # a template that never uses tools gets them as text (tool_prompt.py); False: refused
    tool_prompt_fallback: bool = True
    tool_choice: ToolChoice = AUTO  # what the fallback prompt asks of the reply


@dataclass(frozen=True)
class ChatPrompt:
    text: str  # the conversation as the chat template rendered it
    token_ids: list[int]


def render_chat_prompt(
    tokenizer: Any,
    conversation: list[Message],
    add_generation_prompt: bool = True,
    check_text: Callable[[str], None] | None = None,
    tools: list[dict[str, Any]] | None = None,
    options: ChatOptions | None = None,
) -> ChatPrompt:
    """Render ``conversation`` with the tokenizer's chat template, then encode the text.

    ``check_text`` may refuse the rendered text before it is tokenized (the server refuses
    texts too long for the context). Raises ``ChatTemplateError`` when the template fails
    and ``ValueError`` when it renders nothing. ``tools`` (OpenAI tool definitions) are
    handed to the template; a template that never uses them (``supports_tools``) gets
    them, and earlier tool calls and results, as text (``template_inputs``). ``options``
    (when given) replaces ``add_generation_prompt`` and adds vLLM's other rendering fields.
    """
    options = options or ChatOptions(add_generation_prompt)
    template = options.chat_template
    conversation, tools = template_inputs(tokenizer, conversation, tools, options)
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            chat_template=template,
            **options.template_kwargs,
        )
    except Exception as error:  # jinja errors (roles must alternate, ...), no template
        raise ChatTemplateError(f"could not apply the chat template: {error}") from error
    if check_text is not None:
        check_text(text)
    token_ids = encode_texts(tokenizer, [text], add_special_tokens=False)[0]
    if not token_ids:
        raise ValueError("the conversation renders to an empty prompt")
    return ChatPrompt(text=text, token_ids=token_ids)


def template_inputs(
    tokenizer: Any,
    conversation: list[Message],
    tools: list[dict[str, Any]] | None,
    options: ChatOptions,
) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """The conversation and tools the template is given. A template that never uses
    ``tools`` gets them in the system message and tool calls and results as plain turns
    (``tool_prompt.py``), or, with ``tool_prompt_fallback`` off, a ``ChatTemplateError``
    for tools (tool messages are then left to the template, as before)."""
    if not (tools or has_tool_messages(conversation)):
        return conversation, tools
    if supports_tools(tokenizer, options.chat_template):
        return conversation, tools
    if options.tool_prompt_fallback:
        return with_tool_prompt(conversation, tools, options.tool_choice), None
    if tools:
        raise ChatTemplateError(
            "this model's chat template does not support tools (it never uses 'tools'); "
            "serve a model whose template does, leave tools out, or start the server "
            "with --tool-prompt-fallback to show them to the model as text"
        )
    return conversation, tools


def supports_tools(tokenizer: Any, chat_template: str | None = None) -> bool:
    """Whether the chat template (``chat_template``, else the tokenizer's) renders a
    ``tools`` list."""
    template = chat_template or getattr(tokenizer, "chat_template", None) or ""
    texts = template.values() if isinstance(template, dict) else [template]
    return any("tools" in text for text in texts)


def load_chat_template(value: str) -> str:
    """``--chat-template``: a file's text, or the value itself when it is template text
    (as vLLM); ValueError for a path that is not a file, or a template Jinja cannot parse."""
    path = Path(value).expanduser()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    elif any(mark in value for mark in JINJA_MARKS):
        text = value
    else:
        raise ValueError(f"--chat-template {value!r} looks like a file path, but is not a file")
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"--chat-template: not a valid Jinja template ({error})") from None
    return text
