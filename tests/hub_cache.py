"""Laying out a model folder as the Hugging Face Hub cache does, for offline hub tests."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def seed_snapshot(cache: Path, repo_id: str, source: Path, refs: tuple[str, ...]) -> Path:
    """Lay out ``source`` as the hub cache does: models--org--name/{refs,snapshots/<sha>}."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(source, snapshot)
    (repo / "refs").mkdir()
    for ref in refs:
        (repo / "refs" / ref).write_text(COMMIT)
    return snapshot
