"""A conversation as prompt token ids: the one chat rendering of ``LLM.chat`` and the server.

The chat template already writes every special token the model expects (Llama-3's
starts with ``{{ bos_token }}``), so its text is encoded *without* adding special tokens
again — exactly what ``tokenizer.apply_chat_template(..., tokenize=True)`` produces.
Encoding it with them on would give such models two BOS tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from octavo.inputs.encoding import encode_texts

Message = dict[str, Any]


class ChatTemplateError(ValueError):
    """The tokenizer's chat template could not render the conversation."""


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
) -> ChatPrompt:
    """Render ``conversation`` with the tokenizer's chat template, then encode the text.

    ``check_text`` may refuse the rendered text before it is tokenized (the server refuses
    texts too long for the context). Raises ``ChatTemplateError`` when the template fails
    and ``ValueError`` when it renders nothing. ``tools`` (OpenAI tool definitions) are
    handed to the template, which must support them (``supports_tools``).
    """
    if tools and not supports_tools(tokenizer):
        raise ChatTemplateError(
            "this model's chat template does not support tools (it never uses 'tools')"
        )
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    except Exception as error:  # jinja errors (roles must alternate, ...), no template
        raise ChatTemplateError(f"could not apply the chat template: {error}") from error
    if check_text is not None:
        check_text(text)
    token_ids = encode_texts(tokenizer, [text], add_special_tokens=False)[0]
    if not token_ids:
        raise ValueError("the conversation renders to an empty prompt")
    return ChatPrompt(text=text, token_ids=token_ids)


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template(s) render a ``tools`` list."""
    template = getattr(tokenizer, "chat_template", None) or ""
    texts = template.values() if isinstance(template, dict) else [template]
    return any("tools" in text for text in texts)
