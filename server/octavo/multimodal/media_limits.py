"""How long an image fetch may take and how many bytes an image URL may bring.

``OCTAVO_IMAGE_FETCH_TIMEOUT`` (seconds, default 5: vLLM's ``VLLM_IMAGE_FETCH_TIMEOUT``)
bounds a whole http(s) fetch, redirects and body included. ``OCTAVO_IMAGE_FETCH_MAX_BYTES``
(default 20 MiB, OpenAI's limit per image) caps the bytes read from an http(s) body or a
local file; the decoded size is capped apart, by pixels (``images.MAX_IMAGE_PIXELS``).
"""

from __future__ import annotations

import os

TIMEOUT_ENV = "OCTAVO_IMAGE_FETCH_TIMEOUT"
DEFAULT_TIMEOUT = 5.0
MAX_BYTES_ENV = "OCTAVO_IMAGE_FETCH_MAX_BYTES"
DEFAULT_MAX_BYTES = 20 * 1024 * 1024


def fetch_timeout() -> float:
    """``OCTAVO_IMAGE_FETCH_TIMEOUT`` as positive seconds, else the default."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds > 0, got {text!r}")
    return value


def max_fetch_bytes() -> int:
    """``OCTAVO_IMAGE_FETCH_MAX_BYTES`` as a positive whole number, else the default."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{MAX_BYTES_ENV} must be a positive whole number, got {text!r}")
    return int(text)


def too_large(max_bytes: int, index: int) -> ValueError:
    return ValueError(f"image {index} is larger than {max_bytes} bytes ({MAX_BYTES_ENV})")
