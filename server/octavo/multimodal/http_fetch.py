"""Images fetched over http(s): only from allowed hosts, bounded in time and in bytes.

As vLLM's ``--allowed-media-domains``: a URL's host must be one of the names listed
(exact, case-insensitive; no wildcard, no subdomain matching). Redirects are followed by
hand, at most ``MAX_REDIRECTS``, each target checked as the first URL was (scheme and
host), so a listed host cannot send the server elsewhere. No credentials go out: a URL
with ``user:password@`` is refused, cookies are cleared before every hop and httpx reads
no ``.netrc``. The whole fetch (every hop and the body) has one deadline; the body is
read as it arrives (decompressed, so a gzip bomb counts by what it expands to) and the
fetch stops as soon as it passes the byte cap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from octavo.multimodal.media_limits import TIMEOUT_ENV, too_large

HTTP_SCHEMES = ("http", "https")
MAX_REDIRECTS = 3
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
DOMAINS_FLAG = "--allowed-media-domains"


@dataclass(frozen=True)
class FetchLimits:
    allowed_hosts: frozenset[str]  # lower-case host names
    timeout: float  # seconds for the whole fetch
    max_bytes: int  # most bytes of the (decompressed) body


def fetch_image_bytes(url: str, limits: FetchLimits, index: int) -> bytes:
    """The body at ``url`` (http or https on an allowed host); ValueError naming what
    went wrong: the host, a redirect elsewhere, the deadline, the size or the answer."""
    host = check_http_url(url, limits.allowed_hosts, index)
    deadline = time.monotonic() + limits.timeout
    try:
        with httpx.Client(follow_redirects=False, headers={"User-Agent": "octavo"}) as client:
            return _follow(client, url, limits, deadline, index)
    except httpx.TimeoutException:
        raise _timed_out(host, limits, index) from None
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        raise ValueError(f"image {index}: fetching it from {host} failed: {error}") from None


def check_http_url(url: str, allowed_hosts: frozenset[str], index: int) -> str:
    """The URL's host, if the URL may be fetched; else ValueError saying why not."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in HTTP_SCHEMES:
        raise ValueError(f"image {index}: only http and https URLs are fetched, got {url!r}")
    if not allowed_hosts:
        raise ValueError(
            f"image {index}: http(s) image URLs are fetched only from the hosts in "
            f"{DOMAINS_FLAG}, and none are set: only data: URLs are accepted here"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"image {index}: image URLs may not carry credentials (user@host)")
    host = (parts.hostname or "").lower()
    if host not in allowed_hosts:
        raise ValueError(f"image {index}: the host {host!r} is not in {DOMAINS_FLAG}")
    return host


def _follow(
    client: httpx.Client, url: str, limits: FetchLimits, deadline: float, index: int
) -> bytes:
    """GET ``url``, following at most ``MAX_REDIRECTS`` redirects to allowed hosts."""
    for _ in range(MAX_REDIRECTS + 1):
        host = check_http_url(url, limits.allowed_hosts, index)
        client.cookies.clear()  # nothing a server set goes to the next hop
        with client.stream("GET", url, timeout=_remaining(deadline, host, limits, index)) as reply:
            target = _redirect_target(reply)
            if target is None:
                _check_status(reply, host, index)
                return _read_body(reply, host, limits, deadline, index)
        url = target
    raise ValueError(f"image {index}: more than {MAX_REDIRECTS} redirects")


def _redirect_target(reply: httpx.Response) -> str | None:
    location = reply.headers.get("location")
    if reply.status_code not in REDIRECT_CODES or not location:
        return None
    return str(reply.url.join(location))


def _check_status(reply: httpx.Response, host: str, index: int) -> None:
    if not reply.is_success:
        raise ValueError(f"image {index}: {host} answered HTTP {reply.status_code}")


def _read_body(
    reply: httpx.Response, host: str, limits: FetchLimits, deadline: float, index: int
) -> bytes:
    """The body, read as it arrives, refused once past the byte cap or the deadline."""
    declared = reply.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_bytes:
        raise too_large(limits.max_bytes, index)
    body = bytearray()
    for chunk in reply.iter_bytes():
        body += chunk
        if len(body) > limits.max_bytes:
            raise too_large(limits.max_bytes, index)
        if time.monotonic() > deadline:
            raise _timed_out(host, limits, index)
    return bytes(body)


def _remaining(deadline: float, host: str, limits: FetchLimits, index: int) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _timed_out(host, limits, index)
    return left


def _timed_out(host: str, limits: FetchLimits, index: int) -> ValueError:
    return ValueError(
        f"image {index}: fetching it from {host} timed out after {limits.timeout:g} s "
        f"({TIMEOUT_ENV})"
    )
