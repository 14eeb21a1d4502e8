"""API key check on every route but the probes: /health, /metrics and /version stay open.

/tokenize, /detokenize and FastAPI's /docs, /redoc and /openapi.json need the key too.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from octavo.entrypoints.openai.errors import APIError

OPEN_PATHS = frozenset({"/health", "/metrics", "/version"})


def _bearer_token(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class ApiKeyMiddleware:
    """Require ``Authorization: Bearer <api_key>`` on every path outside ``OPEN_PATHS``."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self._key = app, api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            token = _bearer_token(scope)
            if token is None or not hmac.compare_digest(token.encode(), self._key):
                error = APIError(
                    401,
                    "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
