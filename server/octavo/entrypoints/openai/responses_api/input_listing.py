"""``GET /v1/responses/{id}/input_items``: a stored response's input, item by item, as
OpenAI lists it (each item with an id; a string input is one user message), in pages
(``limit``, ``order``, ``after`` / ``before`` an item id)."""

from __future__ import annotations

from typing import Any, Literal

from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.responses_api.objects import new_item_id

ITEM_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def listed_items(request_input: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's ``input`` (already checked) as items with ids."""
    if isinstance(request_input, str):
        request_input = [{"role": "user", "content": request_input}]
    return [_listed(item) for item in request_input]


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    listed = {**item, "type": kind, "status": item.get("status") or "completed"}
    listed["id"] = item.get("id") or new_item_id(ITEM_ID_PREFIXES.get(kind, "item"))
    if kind == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        extra = {"annotations": []} if part == "output_text" else {}
        listed["content"] = [{"type": part, "text": item["content"], **extra}]
    return listed


def page(
    items: list[dict[str, Any]],
    limit: int,
    order: Literal["asc", "desc"],
    after: str | None,
    before: str | None,
) -> dict[str, Any]:
    ordered = items if order == "asc" else items[::-1]
    ids = [item["id"] for item in ordered]
    start = _position(ids, after, "after") + 1 if after else 0
    end = _position(ids, before, "before") if before else len(ordered)
    data = ordered[start:end][:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + len(data) < end,
    }


def _position(ids: list[str], item_id: str, param: str) -> int:
    if item_id not in ids:
        raise bad_request(f"no input item with id {item_id!r} in this response", param=param)
    return ids.index(item_id)
