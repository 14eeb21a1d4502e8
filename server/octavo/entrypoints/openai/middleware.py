"""ASGI middleware: X-Request-Id on every response, and a cap on request body size.

Plain ASGI (not Starlette's BaseHTTPMiddleware) so streaming responses and client
disconnects pass through untouched.
"""

from __future__ import annotations

import uuid

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from octavo.entrypoints.openai.errors import APIError

REQUEST_ID_HEADER = b"x-request-id"
MAX_REQUEST_ID_LENGTH = 200


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
        if not given or len(given) > MAX_REQUEST_ID_LENGTH or not given.isprintable():
            given = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = given

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != REQUEST_ID_HEADER]
                message["headers"] = [*headers, (REQUEST_ID_HEADER, given.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_id)


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
