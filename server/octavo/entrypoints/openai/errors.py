"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from octavo.engine.async_engine import EngineDead, EngineUnavailable, QueueFull
from octavo.engine.core_messages import AdmissionFailed
from octavo.engine.request_stream import RequestFailed
from octavo.entrypoints.openai.disconnect import ClientDisconnected

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads it
_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """Raise anywhere in a route to answer with this status and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.type = type or _TYPES_BY_STATUS.get(status, "invalid_request_error")
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The body; text from the request (say a model name) is made safe to encode."""
    return {
        "error": {
            "message": _encodable(message),
            "type": type,
            "param": None if param is None else _encodable(param),
            "code": code,
        }
    }


def _encodable(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry (lone surrogates) shown as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def from_engine_exception(error: Exception) -> APIError:
    """Map the engine wrapper's exceptions onto HTTP errors."""
    if isinstance(error, QueueFull):
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return APIError(429, str(error), code="queue_full", headers=headers)
    if isinstance(error, EngineUnavailable):
        return APIError(503, str(error), code=error.reason)
    if isinstance(error, EngineDead):
        return APIError(500, str(error), code="engine_dead")
    if isinstance(error, RequestFailed):
        return APIError(500, str(error), code="request_failed")
    if isinstance(error, AdmissionFailed):
        return APIError(500, str(error), code="internal_error")
    return APIError(500, "internal server error", code="internal_error")


def validation_message(error: RequestValidationError) -> tuple[str, str | None]:
    """One readable line per pydantic error, and the first offending field name."""
    parts, param = [], None
    for item in error.errors():
        location = [str(part) for part in item.get("loc", ()) if part != "body"]
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{'.'.join(location)}: {message}" if location else message)
        param = param or (".".join(location) or None)
    return "; ".join(parts) or "invalid request", param


def install_error_handlers(app: FastAPI) -> None:
    """Every error path of the app answers in OpenAI's error shape."""

    async def on_api_error(_: Request, error: APIError) -> JSONResponse:
        return error.response()

    async def on_validation(_: Request, error: RequestValidationError) -> JSONResponse:
        message, param = validation_message(error)
        return bad_request(message, param).response()

    async def on_http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        headers = dict(error.headers or {})
        return APIError(error.status_code, str(error.detail), headers=headers).response()

    async def on_engine(_: Request, error: Exception) -> JSONResponse:
        return from_engine_exception(error).response()

    async def on_disconnect(_: Request, error: ClientDisconnected) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def on_unexpected(_: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=error)
        return APIError(500, "internal server error", code="internal_error").response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(ClientDisconnected, on_disconnect)
    for engine_error in (QueueFull, EngineUnavailable, EngineDead, RequestFailed, AdmissionFailed):
        app.add_exception_handler(engine_error, on_engine)
    app.add_exception_handler(Exception, on_unexpected)
