"""Command-line value types: sizes with units, bounded numbers, choices, booleans.

Each turns a flag's (or an ``OCTAVO_*`` variable's) text into a value and raises
``argparse.ArgumentTypeError`` with a message naming what was expected.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

_SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def parse_size(text: str) -> int:
    """Bytes from ``4294967296``, ``4G``/``4GB`` (powers of 10) or ``4GiB`` (powers of 2)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(i?)b?\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 4GiB, 512MiB)")
    number, unit, binary = match.groups()
    scale = 1024 ** ("kmgt".index(unit) + 1) if unit and binary else _SIZE_UNITS[unit]
    value = int(float(number) * scale)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def one_of(choices: tuple[Any, ...], convert: Callable[[str], Any] = str) -> Callable[[str], Any]:
    """A type that also checks membership (argparse skips ``choices`` for defaults)."""

    def check(text: str) -> Any:
        value = convert(text.lower() if convert is str else text)
        if value not in choices:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not one of {', '.join(map(str, choices))}"
            )
        return value

    check.__name__ = convert.__name__
    return check


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in _TRUE | _FALSE:
        raise ValueError(f"expected true/false, got {text!r}")
    return lowered in _TRUE


def json_object(raw: str | dict[str, Any], what: str) -> dict[str, Any]:
    """A dict, or the text of a JSON object, as a dict (a JSON-valued flag such as
    ``--speculative-config``); otherwise a ValueError naming WHAT."""
    if isinstance(raw, dict):
        return dict(raw)
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what}: not JSON ({error.msg}): {raw!r}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{what}: expected a JSON object, got {raw!r}")
    return values
