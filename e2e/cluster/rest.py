"""A tiny Kubernetes REST client on the standard library (the CLI must not need the venv)."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ApiError(RuntimeError):
    def __init__(self, status: int, body: Any, what: str):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)[:500]
        super().__init__(f"{what}: HTTP {status}: {message}")


@dataclass
class Credentials:
    server: str
    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str | None = None


class Rest:
    def __init__(self, creds: Credentials, timeout: float = 10.0):
        self.creds = creds
        self.timeout = timeout
        self._ctx = ssl.create_default_context(cafile=str(creds.ca_file))
        if creds.cert_file and creds.key_file:
            self._ctx.load_cert_chain(str(creds.cert_file), str(creds.key_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201, 202),
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.creds.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.creds.token:
            req.add_header("Authorization", f"Bearer {self.creds.token}")
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        text = raw.decode(errors="replace")
        try:
            parsed: Any = json.loads(text) if text else None
        except ValueError:
            parsed = text
        if status not in ok:
            raise ApiError(status, parsed, f"{method} {path}")
        return status, parsed

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)[1]

    def post(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", path, body, **kw)[1]


def probe(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str]:
    """GET URL; (status, body), or (0, error text) when nothing answered."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ssl.SSLError) as exc:
        return 0, str(exc)


def insecure_context() -> ssl.SSLContext:
    """For loopback health probes of components that serve a self-signed certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def wait_until(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.25,
    on_poll: Callable[[], None] | None = None,
) -> Any:
    """Poll CHECK until it returns something truthy; TimeoutError after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        if on_poll is not None:
            on_poll()
        try:
            last = check()
        except (OSError, ApiError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})"
            )
        time.sleep(interval)
