"""Images read from ``file://`` URLs, only inside ``--allowed-local-media-path``.

As vLLM's flag of that name: with no folder set every ``file://`` URL is refused. The
path is resolved first (symlinks followed, ``..`` folded), and the real path must lie
inside the real folder, so a symlink or ``../`` that leads out of it is refused. The
file is read up to the byte cap (``OCTAVO_IMAGE_FETCH_MAX_BYTES``).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from octavo.multimodal.media_limits import too_large

LOCAL_PATH_FLAG = "--allowed-local-media-path"
LOCAL_HOSTS = ("", "localhost")


def media_root(path: str | Path | None) -> Path | None:
    """``--allowed-local-media-path`` as the real folder it names; ValueError if it is not
    a folder. None when unset."""
    if path is None or str(path) == "":
        return None
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise ValueError(f"{LOCAL_PATH_FLAG} {path} is not a folder")
    return root


def read_local_image(url: str, root: Path | None, max_bytes: int, index: int) -> bytes:
    """The bytes of the file a ``file://`` URL names, if it lies inside ``root``."""
    if root is None:
        raise ValueError(
            f"image {index}: file:// image URLs are read only under {LOCAL_PATH_FLAG}, "
            "which is not set"
        )
    path = _url_path(url, index)
    real = _resolved(path, index)
    if not real.is_relative_to(root):
        raise ValueError(f"image {index}: {path} is outside {LOCAL_PATH_FLAG} ({root})")
    if not real.is_file():
        raise ValueError(f"image {index}: {path} is not an existing file")
    if real.stat().st_size > max_bytes:
        raise too_large(max_bytes, index)
    try:
        with real.open("rb") as file:
            data = file.read(max_bytes + 1)  # the file may have grown since
    except OSError as error:
        raise ValueError(f"image {index}: {path} could not be read: {error}") from None
    if len(data) > max_bytes:
        raise too_large(max_bytes, index)
    return data


def _url_path(url: str, index: int) -> Path:
    parts = urlsplit(url)
    if parts.netloc.lower() not in LOCAL_HOSTS:
        raise ValueError(
            f"image {index}: a file:// URL names a file on this machine, not on "
            f"{parts.netloc!r} (file:///path/to/image.png)"
        )
    path = Path(unquote(parts.path))
    if not path.is_absolute():
        raise ValueError(f"image {index}: a file:// URL needs an absolute path, got {url!r}")
    return path


def _resolved(path: Path, index: int) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop, say
        raise ValueError(f"image {index}: {path} could not be resolved: {error}") from None
