"""Where Octavo keeps what it makes once per machine: converted models, compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$OCTAVO_CACHE``, else the user's cache folder (``~/.cache/octavo`` on Linux)."""
    configured = os.environ.get("OCTAVO_CACHE")
    if configured:
        return Path(configured)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("octavo"))
