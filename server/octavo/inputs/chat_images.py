"""Image content parts of chat messages: taken out in order, placeholders left in their place.

OpenAI's ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``
parts become the model's image placeholder (``<image>`` for LLaVA), the images
themselves go to the processor in order. As vLLM, a chat template that iterates over a
message's content parts gets them as ``{"type": "image"}`` and ``{"type": "text"}``
parts; any other template gets one string: the placeholders, then the texts, one a line.
A message without image parts is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

Message = dict[str, Any]
# A template that loops over message content: it takes lists of parts ("openai" format).
_CONTENT_LOOP = re.compile(r"for\s+\w+\s+in\s+\w+(\[['\"]content['\"]\]|\.content)")


def takes_content_parts(template: str | None) -> bool:
    """Whether a chat template iterates over each message's content parts."""
    return bool(template) and _CONTENT_LOOP.search(template) is not None


def split_images(
    conversation: list[Message], placeholder: str | None, template: str | None
) -> tuple[list[Message], list[str]]:
    """The conversation with each image part replaced, and the image URLs in order.
    ``placeholder`` None (a text-only model): ValueError if any message holds an image."""
    parts_format = takes_content_parts(template)
    images: list[str] = []
    messages = []
    for message in conversation:
        content = message.get("content")
        urls = _image_urls(content) if isinstance(content, list) else []
        if not urls:
            messages.append(message)
            continue
        if placeholder is None:
            raise ValueError("this model is text-only: it takes no image content parts")
        images += urls
        texts = [part.get("text") or "" for part in content if part.get("type") == "text"]
        if parts_format:
            parts = [_as_template_part(part) for part in content]
        else:
            parts = "\n".join([placeholder] * len(urls) + texts)
        messages.append({**message, "content": parts})
    return messages, images


def _image_urls(content: list) -> list[str]:
    urls = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            urls.append(_url_of(part.get("image_url")))
        elif kind != "text":
            raise ValueError(
                f"unsupported content part {kind!r}: Octavo takes 'text' and 'image_url' parts"
            )
    return urls


def _url_of(image_url: Any) -> str:
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url:
        raise ValueError(
            'an image_url part needs {"image_url": {"url": "data:image/...;base64,..."}}'
        )
    return url


def _as_template_part(part: dict) -> dict:
    if part.get("type") == "image_url":
        return {"type": "image"}
    return {"type": "text", "text": part.get("text") or ""}
