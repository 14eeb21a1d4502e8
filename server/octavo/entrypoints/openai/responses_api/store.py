"""Responses kept in memory for ``GET``/``DELETE /v1/responses/{id}`` and chaining.

Bounded: at most ``OCTAVO_RESPONSES_STORE_SIZE`` responses (default
``DEFAULT_STORE_SIZE``; read when the server starts, a bad value stops it there); past
that the least recently used one is forgotten (a later ``GET`` naming it is a 404, a
``previous_response_id`` a 400). Nothing survives a restart.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from octavo.entrypoints.openai.protocol import ChatMessage
from octavo.entrypoints.openai.responses_api.objects import ResponseObject

DEFAULT_STORE_SIZE = 1000
STORE_SIZE_ENV = "OCTAVO_RESPONSES_STORE_SIZE"


@dataclass
class StoredResponse:
    response: ResponseObject
    history: list[ChatMessage]  # every turn up to and including this response's output
    input_items: list[dict[str, Any]] = field(default_factory=list)  # this request's, with ids


def store_size_from_env() -> int:
    """``OCTAVO_RESPONSES_STORE_SIZE`` (a positive count), else the default."""
    text = os.environ.get(STORE_SIZE_ENV, "").strip()
    if not text:
        return DEFAULT_STORE_SIZE
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{STORE_SIZE_ENV} must be a positive whole number, got {text!r}")
    return int(text)


STORE_SIZE = store_size_from_env()


class ResponseStore:
    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity if capacity is not None else STORE_SIZE
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, entry: StoredResponse) -> None:
        with self._lock:
            self._entries[entry.response.id] = entry
            self._entries.move_to_end(entry.response.id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)
