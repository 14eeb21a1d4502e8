"""A Responses message's content with ``input_image`` parts, as chat content parts.

``{"type": "input_image", "image_url": "data:image/png;base64,..."}`` (or an ``http(s)://``
or ``file://`` URL) becomes the chat part ``{"type": "image_url", "image_url": {"url":
...}}``, so the image takes the chat path: the same URL rules (``--allowed-media-domains``,
``--allowed-local-media-path``), the same processor, the same 400s (a text-only model
included). Text parts become ``text`` parts; ``file_id`` images are refused (there is
no file store).
"""

from __future__ import annotations

from typing import Any

from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.protocol import ImageURL, ImageURLPart, TextPart

IMAGE_PART = "input_image"
TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def has_image_parts(content: Any) -> bool:
    """Whether a message's content is a list holding an ``input_image`` part."""
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == IMAGE_PART for part in content
    )


def chat_parts(content: list[Any], path: str) -> list[ImageURLPart | TextPart]:
    """Each part as a chat content part; a 400 naming the part for anything else."""
    parts: list[ImageURLPart | TextPart] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"{path}[{index}]"
        if kind == IMAGE_PART:
            parts.append(_image_part(part, where))
            continue
        field = TEXT_PARTS.get(kind)
        if field is None or not isinstance(part.get(field), str):
            raise bad_request(
                f"content part type {kind!r} is not supported (this server takes "
                "input_text, output_text, refusal and input_image)",
                param=f"{where}.type",
            )
        parts.append(TextPart(type="text", text=part[field]))
    return parts


def _image_part(part: dict[str, Any], where: str) -> ImageURLPart:
    url = part.get("image_url")
    if isinstance(url, dict):  # the chat spelling, {"url": ...}, is taken too
        url = url.get("url")
    if not isinstance(url, str) or not url:
        what = "file_id images are not supported: " if part.get("file_id") else ""
        raise bad_request(
            f"{what}an input_image part needs an image_url: a data:, http(s):// or file:// URL",
            param=f"{where}.image_url",
        )
    detail = part.get("detail")
    return ImageURLPart(
        type="image_url",
        image_url=ImageURL(url=url, detail=detail if isinstance(detail, str) else None),
    )
