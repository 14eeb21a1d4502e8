"""What a request asks its output to follow (vLLM's ``StructuredOutputsParams``).

Exactly one of: ``json`` (a JSON schema), ``json_object`` (any JSON object), ``regex``,
``choice`` (one of these strings) or ``grammar`` (EBNF, xgrammar's GBNF dialect). A
schema given as a dict is kept as canonical JSON text, so equal schemas share one
compiled grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json, dict | list | bool):
            object.__setattr__(self, "json", _canonical_json(self.json))
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        set_kinds = [kind for kind in KINDS if self._value(kind) not in (None, False)]
        if len(set_kinds) != 1:
            raise ValueError(
                "structured output needs exactly one of json, json_object, regex, choice "
                f"or grammar; got {', '.join(set_kinds) or 'none'}"
            )
        if self.choice is not None and (not self.choice or not all(self.choice)):
            raise ValueError("choice must be a non-empty list of non-empty strings")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if self._value(kind) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as text (the choices as a JSON list)."""
        value = self._value(self.kind)
        if self.kind == "json_object":
            return ""
        return _canonical_json(list(value)) if self.kind == "choice" else value

    def cache_key(self) -> tuple[str, str]:
        return self.kind, self.spec

    def _value(self, kind: str) -> Any:
        return getattr(self, kind)


def _canonical_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)  # keeps key order
