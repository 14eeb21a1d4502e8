"""The llm-d router's source for the endpoint picker build, from the Go module proxy's zip.

The proxy serves `github.com/llm-d/llm-d-router@v0.10.0` only as its `.zip` (no `.mod`,
`.info` or checksum-database entry), so `go` cannot fetch it as a module. The zip is
downloaded here from the proxy, checked against the SHA-256 pinned in versions.py, and
unpacked next to a copy of the wrapper module (e2e/cluster/go.mod), which replaces the
router with that folder (`./llm-d-router`). Every other module verifies as usual.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import urllib.request
import zipfile
from pathlib import Path

from . import versions

MODULE = "github.com/llm-d/llm-d-router"
SOURCE_FOLDER = "llm-d-router"  # what the wrapper's go.mod replaces the module with


class SourceError(RuntimeError):
    pass


def proxy_url() -> str:
    """The first proxy of $GOPROXY (Go's default when unset)."""
    value = os.environ.get("GOPROXY") or "https://proxy.golang.org"
    for entry in value.replace("|", ",").split(","):
        if entry.startswith(("http://", "https://")):
            return entry.rstrip("/")
    raise SourceError(f"GOPROXY={value!r} names no HTTP proxy to fetch {MODULE} from")


def download_zip(cache: Path) -> bytes:
    """The pinned release's zip (cached under CACHE once its checksum matched)."""
    cached = cache / f"llm-d-router-{versions.LLM_D_ROUTER}.zip"
    if cached.exists():
        data = cached.read_bytes()
    else:
        url = f"{proxy_url()}/{MODULE}/@v/{versions.LLM_D_ROUTER}.zip"
        with urllib.request.urlopen(url, timeout=300) as response:
            data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != versions.LLM_D_ROUTER_ZIP_SHA256:
        cached.unlink(missing_ok=True)
        raise SourceError(
            f"{MODULE}@{versions.LLM_D_ROUTER}.zip has SHA-256 {digest}, "
            f"expected {versions.LLM_D_ROUTER_ZIP_SHA256} (e2e/cluster/versions.py)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(data)
    return data


def unpack(data: bytes, target: Path) -> None:
    """Unpack the module zip (entries are `MODULE@VERSION/...`) into TARGET."""
    prefix = f"{MODULE}@{versions.LLM_D_ROUTER}/"
    shutil.rmtree(target, ignore_errors=True)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for entry in archive.infolist():
            if entry.is_dir() or not entry.filename.startswith(prefix):
                continue
            path = target / entry.filename.removeprefix(prefix)
            if target.resolve() not in path.resolve().parents:
                raise SourceError(f"{entry.filename} would unpack outside {target}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(archive.read(entry))


def prepare_build_dir(module_dir: Path, build_dir: Path, cache: Path) -> Path:
    """BUILD_DIR with the wrapper's go.mod/go.sum and the router's source beside them."""
    build_dir.mkdir(parents=True, exist_ok=True)
    for name in ("go.mod", "go.sum"):
        if (module_dir / name).exists():
            shutil.copy(module_dir / name, build_dir / name)
    unpack(download_zip(cache), build_dir / SOURCE_FOLDER)
    return build_dir
