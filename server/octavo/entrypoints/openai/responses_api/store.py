"""Responses kept in memory for ``GET``/``DELETE /v1/responses/{id}`` and chaining.

Bounded twice, each bound read when the server starts (a bad value stops it there): at
most ``OCTAVO_RESPONSES_STORE_SIZE`` responses (default ``DEFAULT_STORE_SIZE``) and at
most ``OCTAVO_RESPONSES_STORE_BYTES`` bytes of them (default ``DEFAULT_STORE_BYTES``,
each entry counted as its JSON: the response, the conversation it continues and its input
items). Past either, the least recently used one is forgotten first (a later ``GET``
naming it is a 404, a ``previous_response_id`` a 400); an entry larger than the whole
byte bound is not kept at all (and evicts nothing). The store belongs to one server
process: nothing survives a restart, and another replica does not know the ids.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from octavo.entrypoints.openai.protocol import ChatMessage
from octavo.entrypoints.openai.responses_api.objects import ResponseObject

DEFAULT_STORE_SIZE = 1000
STORE_SIZE_ENV = "OCTAVO_RESPONSES_STORE_SIZE"
DEFAULT_STORE_BYTES = 256 * 1024 * 1024
STORE_BYTES_ENV = "OCTAVO_RESPONSES_STORE_BYTES"
_ITEMS_JSON = TypeAdapter(list[dict[str, Any]])


@dataclass
class StoredResponse:
    response: ResponseObject
    history: list[ChatMessage]  # every turn up to and including this response's output
    input_items: list[dict[str, Any]] = field(default_factory=list)  # this request's, with ids

    def size(self) -> int:
        """Bytes of JSON this entry holds (an earlier turn shared with another entry is
        counted in each: the bound errs on the safe side)."""
        history = sum(len(message.model_dump_json()) for message in self.history)
        items = len(_ITEMS_JSON.dump_json(self.input_items))
        return len(self.response.model_dump_json()) + history + items


def positive_env(name: str, default: int) -> int:
    """The environment variable ``name`` as a positive whole number, else ``default``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a positive whole number, got {text!r}")
    return int(text)


def store_size_from_env() -> int:
    """``OCTAVO_RESPONSES_STORE_SIZE`` (a positive count), else the default."""
    return positive_env(STORE_SIZE_ENV, DEFAULT_STORE_SIZE)


def store_bytes_from_env() -> int:
    """``OCTAVO_RESPONSES_STORE_BYTES`` (a positive number of bytes), else the default."""
    return positive_env(STORE_BYTES_ENV, DEFAULT_STORE_BYTES)


STORE_SIZE = store_size_from_env()
STORE_BYTES = store_bytes_from_env()


class ResponseStore:
    def __init__(self, capacity: int | None = None, max_bytes: int | None = None) -> None:
        self.capacity = capacity if capacity is not None else STORE_SIZE
        self.max_bytes = max_bytes if max_bytes is not None else STORE_BYTES
        self._entries: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, entry: StoredResponse) -> None:
        size = entry.size()  # outside the lock: proportional to the conversation
        with self._lock:
            self._forget(entry.response.id)
            if size > self.max_bytes:  # never fits: the others stay
                return
            self._entries[entry.response.id] = (entry, size)
            self._bytes += size
            while len(self._entries) > self.capacity or self._bytes > self.max_bytes:
                self._forget(next(iter(self._entries)))

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            kept = self._entries.get(response_id)
            if kept is None:
                return None
            self._entries.move_to_end(response_id)
            return kept[0]

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._forget(response_id)

    def _forget(self, response_id: str) -> bool:
        kept = self._entries.pop(response_id, None)
        if kept is not None:
            self._bytes -= kept[1]
        return kept is not None

    @property
    def num_bytes(self) -> int:
        """Bytes of JSON the kept entries hold."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
