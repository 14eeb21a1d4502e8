"""Where Octavo keeps what it makes once per machine: converted models, compiled kernels."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """``$OCTAVO_CACHE``, else the user's cache folder (``~/.cache/octavo`` on Linux)."""
    configured = os.environ.get("OCTAVO_CACHE")
    if configured:
        return Path(configured)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("octavo"))


def fill_once(target: Path, fill: Callable[[Path], None]) -> Path:
    """``target``, filled by ``fill(staging)`` in a private folder beside it and renamed
    into place: a process killed halfway leaves nothing a later one would take for done,
    and of two concurrent fills the first rename wins."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fill(staging)
        if not target.exists():
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
