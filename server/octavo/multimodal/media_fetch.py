"""Image URLs as the bytes they name: vLLM's media connector, with its flags.

- ``data:`` URLs are passed on as they are (``images.load_image`` decodes them);
- ``http://`` and ``https://`` are fetched only from the hosts in
  ``--allowed-media-domains`` (none by default), within ``OCTAVO_IMAGE_FETCH_TIMEOUT``
  and ``OCTAVO_IMAGE_FETCH_MAX_BYTES`` (``http_fetch.py``);
- ``file://`` is read only inside ``--allowed-local-media-path`` (``local_media.py``);
- any other scheme is refused.

Every refusal is a ValueError naming the image and the problem (the server answers 400).
Fetching blocks: the server calls this in its tokenizer threads, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo.multimodal.http_fetch import HTTP_SCHEMES, FetchLimits, fetch_image_bytes
from octavo.multimodal.local_media import media_root, read_local_image
from octavo.multimodal.media_limits import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT,
    fetch_timeout,
    max_fetch_bytes,
)


@dataclass(frozen=True)
class MediaConnector:
    """Where image URLs may lead. The default takes ``data:`` URLs only."""

    allowed_domains: frozenset[str] = frozenset()
    local_root: Path | None = None  # the real --allowed-local-media-path
    timeout: float = DEFAULT_TIMEOUT
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_settings(
        cls, domains: str | Iterable[str] | None, local_path: str | Path | None
    ) -> MediaConnector:
        """From the two flags and the environment's limits; ValueError for a bad value."""
        return cls(
            allowed_domains=domain_set(domains),
            local_root=media_root(local_path),
            timeout=fetch_timeout(),
            max_bytes=max_fetch_bytes(),
        )

    def load(self, url: str, index: int = 0) -> str | bytes:
        """A ``data:`` URL as it is, or the bytes an http(s) or file URL names."""
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            return url
        if scheme in HTTP_SCHEMES:
            limits = FetchLimits(self.allowed_domains, self.timeout, self.max_bytes)
            return fetch_image_bytes(url, limits, index)
        if scheme == "file":
            return read_local_image(url, self.local_root, self.max_bytes, index)
        shown = f"{scheme}:" if scheme else "a bare path"
        raise ValueError(
            f"image {index}: image URLs are data:, http(s):// (--allowed-media-domains) or "
            f"file:// (--allowed-local-media-path), got {shown}"
        )

    def load_all(self, urls: list[str]) -> list[str | bytes]:
        """Each URL in order, loaded as ``load`` does."""
        return [self.load(url, index) for index, url in enumerate(urls)]


def domain_set(domains: str | Iterable[str] | None) -> frozenset[str]:
    """Host names, lower-cased; one string may list several (comma or space between)."""
    if isinstance(domains, str):
        domains = domains.replace(",", " ").split()
    return frozenset(domain.strip().lower() for domain in domains or () if domain.strip())


def media_connector(args: Any) -> MediaConnector:
    """The connector of an ``EngineArgs``' ``--allowed-media-domains`` and
    ``--allowed-local-media-path``."""
    return MediaConnector.from_settings(args.allowed_media_domains, args.allowed_local_media_path)
