"""Where the cache, the built binaries and a running cluster's state live."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent  # e2e/cluster: the Python package and the Go wrapper
REPO_ROOT = HERE.parent.parent
MODULE_DIR = HERE  # the wrapper Go module every binary is built from (go.mod, go.sum)


def cache_dir() -> Path:
    """`$OCTAVO_E2E_CACHE`, else `$XDG_CACHE_HOME/octavo-e2e`, else `~/.cache/octavo-e2e`."""
    explicit = os.environ.get("OCTAVO_E2E_CACHE")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(xdg).expanduser() / "octavo-e2e").resolve()


def state_dir() -> Path:
    """A running cluster's files: certificates, kubeconfigs, etcd data, logs, pids.

    `$OCTAVO_E2E_STATE_DIR` if set; else one folder per checkout under the cache, so that two
    checkouts on one machine (two people, or a person and CI) never share a cluster.
    """
    explicit = os.environ.get("OCTAVO_E2E_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    digest = hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:10]
    return cache_dir() / "clusters" / f"{REPO_ROOT.name}-{digest}"
