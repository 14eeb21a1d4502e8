"""``--hf-overrides`` (vLLM's flag): JSON merged into a model's config.json before anything
reads it, e.g. ``'{"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
"original_max_position_embeddings": 32768}}'`` to serve Qwen3 at 128k.

Nested objects (``text_config``) are merged key by key; a rope setting (``rope_scaling``,
``rope_parameters``) and every other non-object value is replaced whole, as vLLM sets
dict-valued config attributes (a yarn override keeps no leftover llama3 keys).
"""

from __future__ import annotations

import copy
from typing import Any

from octavo.arg_types import json_object

REPLACED_WHOLE = ("rope_scaling", "rope_parameters")


def parse_hf_overrides(raw: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """The flag's JSON object (or ``LLM(hf_overrides={...})``'s dict); ValueError else."""
    if raw is None:
        return None
    if not isinstance(raw, (str, dict)):
        raise ValueError(
            f"--hf-overrides: expected a JSON object (a dict), got {type(raw).__name__}"
        )
    return json_object(raw, "--hf-overrides")


def apply_hf_overrides(config: dict[str, Any], overrides: dict[str, Any] | None) -> dict:
    """A copy of ``config`` (a config.json's fields) with ``overrides`` merged in."""
    merged = copy.deepcopy(config)
    _merge(merged, overrides or {})
    return merged


def _merge(target: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        nested = isinstance(value, dict) and isinstance(target.get(key), dict)
        if nested and key not in REPLACED_WHOLE:
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
