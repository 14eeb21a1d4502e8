"""Test inputs that third-party tools take long to make, kept across runs.

A folder lives under ``$OCTAVO_CACHE/tests/<name>-<key>``, the key a sha256 of everything
that determines its content: the input files' bytes, the script that makes it and the
versions of the packages that write it. A change to any of them makes it again; a run
with an empty cache makes it as every run did before. What a test checks against the
folder is unchanged: the folder is the tool's own output, only not remade each run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from importlib.metadata import version
from pathlib import Path

from octavo.cache_dirs import cache_root, fill_once


def content_key(files: Iterable[Path], folders: Iterable[Path], packages: Iterable[str]) -> str:
    """sha256 over the files, every file under the folders (by relative path) and the
    installed versions of the packages."""
    digest = hashlib.sha256()
    for package in packages:
        digest.update(f"{package}=={version(package)}\0".encode())
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cached_folder(name: str, key: str, make: Callable[[Path], None]) -> Path:
    """The folder ``make(folder)`` fills, made once per key (``cache_dirs.fill_once``)."""
    target = cache_root() / "tests" / f"{name}-{key}"
    return target if target.is_dir() else fill_once(target, make)
