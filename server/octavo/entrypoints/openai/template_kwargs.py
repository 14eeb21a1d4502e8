"""``--default-chat-template-kwargs``: a JSON object handed to every chat template render,
under each request's own ``chat_template_kwargs`` (vLLM's flag)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from octavo.entrypoints.openai.protocol import CHAT_TEMPLATE_ARGUMENTS


def template_kwargs_arg(text: str) -> dict[str, Any]:
    """The flag's value: a JSON object whose keys the server does not set itself."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    taken = sorted(set(value) & CHAT_TEMPLATE_ARGUMENTS)
    if taken:
        raise argparse.ArgumentTypeError(
            f"may not set {', '.join(taken)} (the requests' own fields set those)"
        )
    return value


template_kwargs_arg.__name__ = "JSON object"
