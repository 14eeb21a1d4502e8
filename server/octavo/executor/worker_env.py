"""The environment worker processes start with (local ranks and a worker host's alike)."""

from __future__ import annotations

import os
from pathlib import Path

import octavo


def worker_env() -> dict[str, str]:
    """Our environment, with this ``octavo`` first on the workers' import path."""
    env = dict(os.environ)
    source = str(Path(octavo.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    return env
