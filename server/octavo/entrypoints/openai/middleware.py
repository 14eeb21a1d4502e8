"""ASGI middleware: X-Request-Id on every response, caps on request body size and on
requests in flight.

Plain ASGI (not Starlette's BaseHTTPMiddleware) so streaming responses and client
disconnects pass through untouched.
"""

from __future__ import annotations

import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from octavo.entrypoints.openai.auth import OPEN_PATHS
from octavo.entrypoints.openai.errors import RETRY_AFTER_SECONDS, APIError

REQUEST_ID_HEADER = b"x-request-id"
MAX_REQUEST_ID_LENGTH = 200

# When the HTTP request being handled arrived (time.monotonic()): a drain still admits the
# requests that were already in the server when it began (compiling their constraint).
request_arrival: ContextVar[float | None] = ContextVar("request_arrival", default=None)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class RequestIdMiddleware:
    """Echo the client's X-Request-Id (or a new one) on the response; keep it in scope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, REQUEST_ID_HEADER)
        from_client = bool(given) and len(given) <= MAX_REQUEST_ID_LENGTH and given.isprintable()
        if not from_client:
            given = uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"], state["client_request_id"] = given, from_client
        request_arrival.set(time.monotonic())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != REQUEST_ID_HEADER]
                message["headers"] = [*headers, (REQUEST_ID_HEADER, given.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_id)


@dataclass(frozen=True)
class RequestIds:
    """``response``: what the response's ``id`` is built from; ``engine``: the engine's
    request id (unique even when two clients send the same id)."""

    response: str
    engine: str


def request_ids(scope: Scope, prefix: str, body_request_id: str | None) -> RequestIds:
    """vLLM's rule: the X-Request-Id header, else the body's ``request_id``, else random."""
    state = scope.get("state", {})
    chosen = state.get("request_id") if state.get("client_request_id") else body_request_id
    if chosen is None:
        response = f"{prefix}-{state.get('request_id') or uuid.uuid4().hex}"
        return RequestIds(response, response)
    response = f"{prefix}-{chosen}"
    return RequestIds(response, f"{response}-{uuid.uuid4().hex[:8]}")


class BodySizeLimitMiddleware:
    """Answer 413 when a request body is larger than ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large().response()(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _too_large(self) -> APIError:
        return APIError(
            413,
            f"request body is larger than the limit of {self.max_bytes} bytes",
            code="request_too_large",
        )

    def _counting(self, receive: Receive) -> Receive:
        """For bodies without a Content-Length: count while the app reads."""
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self._too_large().message)
            return message

        return counted


class ConcurrencyLimitMiddleware:
    """Answer 503 (with Retry-After) while ``limit`` requests are already in flight.

    The probe paths (/health, /metrics, /version) are never counted nor refused, so a
    busy server stays in its Service. uvicorn's own ``limit_concurrency`` sits a little
    above ``limit`` as the hard cap on connections (see ``uvicorn_config.py``).
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            await self._overloaded().response()(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    def _overloaded(self) -> APIError:
        return APIError(
            503,
            f"the server is already handling {self.limit} requests "
            "(--limit-concurrency); retry later",
            code="overloaded",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
