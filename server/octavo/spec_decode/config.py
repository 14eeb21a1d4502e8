"""``speculative_config`` in vLLM's spelling, parsed and checked.

- ``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": a,
  "prompt_lookup_min": b}``: proposals copied from the sequence's own earlier tokens.
- ``{"model": "<folder>", "num_speculative_tokens": k}``: a draft model of the same
  vocabulary (``method`` defaults to ``draft_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo.arg_types import json_object

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16
KNOWN_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None

    @classmethod
    def parse(cls, raw: str | dict[str, Any]) -> SpeculativeConfig:
        """From the flag's JSON text or ``LLM(speculative_config={...})``; ValueError on
        anything it cannot take, naming the key."""
        values = json_object(raw, "speculative_config")
        unknown = sorted(set(values) - KNOWN_KEYS)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown keys {unknown}; known: {sorted(KNOWN_KEYS)}"
            )
        method = values.get("method") or ("draft_model" if values.get("model") else None)
        if method not in METHODS:
            raise ValueError(f"speculative_config: method {method!r} is not one of {list(METHODS)}")
        config = cls(
            method=method,
            num_speculative_tokens=_count(values, "num_speculative_tokens", None),
            prompt_lookup_min=_count(values, "prompt_lookup_min", 1),
            prompt_lookup_max=_count(values, "prompt_lookup_max", 4),
            model=values.get("model"),
        )
        config.check()
        return config

    def check(self) -> None:
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"speculative_config: num_speculative_tokens must be in "
                f"[1, {MAX_SPECULATIVE_TOKENS}], got {self.num_speculative_tokens}"
            )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                "speculative_config: prompt_lookup_min "
                f"({self.prompt_lookup_min}) > prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        if self.method == "draft_model" and not self.model:
            raise ValueError('speculative_config: a draft model needs "model": "<folder>"')


def _count(values: dict[str, Any], key: str, default: int | None) -> int:
    value = values.get(key, default)
    if value is None:
        raise ValueError(f"speculative_config: {key} is required")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"speculative_config: {key} must be an integer >= 1, got {value!r}")
    return value
