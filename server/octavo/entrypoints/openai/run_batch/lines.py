"""Batch file lines: an input line is a request (or a malformed line), an output line a result.

The shapes are vLLM's ``vllm run-batch`` (OpenAI's Batch format): input
``{"custom_id", "method": "POST", "url", "body"}``; output
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

SUPPORTED_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
STREAM_MESSAGE = "Request must not be sent in stream mode (stream: true is not allowed in a batch)"


@dataclass(frozen=True)
class BatchRequest:
    """A well-formed input line."""

    line_number: int
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class BadLine:
    """A malformed input line: it gets an error line, never no line."""

    line_number: int
    custom_id: str
    message: str


def derived_custom_id(line_number: int) -> str:
    """The ``custom_id`` of a line that has none: its 1-based line number in the input."""
    return f"line-{line_number}"


def parse_line(raw: bytes, line_number: int) -> BatchRequest | BadLine:
    """One input line (not blank) as a request, or as a malformed line saying why."""
    where = f"line {line_number}"
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return BadLine(line_number, derived_custom_id(line_number), f"{where} is not UTF-8")
    except json.JSONDecodeError as error:
        message = f"{where} is not JSON: {error.msg} at column {error.colno}"
        return BadLine(line_number, derived_custom_id(line_number), message)
    except RecursionError:  # Python's JSON parser recurses once per nesting level
        message = f"{where} is nested too deeply to parse (arrays or objects in one another)"
        return BadLine(line_number, derived_custom_id(line_number), message)
    if not isinstance(record, dict):
        return BadLine(line_number, derived_custom_id(line_number), f"{where} is not an object")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        message = f"{where} has no custom_id (a non-empty string); named after its line number"
        return BadLine(line_number, derived_custom_id(line_number), message)
    problem = request_problem(record)
    if problem is not None:
        return BadLine(line_number, custom_id, f"{where}: {problem}")
    return BatchRequest(line_number, custom_id, record["url"], record["body"])


def request_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with a line's method, url and body (None: nothing)."""
    method = record.get("method")
    if not isinstance(method, str) or method.upper() != "POST":
        return f"method must be POST, got {method!r}"
    url = record.get("url")
    if url not in SUPPORTED_URLS:
        return f"url {url!r} is not supported; use one of {', '.join(SUPPORTED_URLS)}"
    body = record.get("body")
    if not isinstance(body, dict):
        return "body must be a JSON object"
    if body.get("stream") is True:
        return STREAM_MESSAGE
    return None


def new_id() -> str:
    return uuid.uuid4().hex


def result_line(custom_id: str, status_code: int, request_id: str, body: Any) -> dict[str, Any]:
    """The output line of a request the app answered: its body on success, else the error
    body (``{"error": {...}}``) in ``error`` and ``response.body`` null, as vLLM."""
    ok = status_code < 400
    return {
        "id": f"vllm-{new_id()}",
        "custom_id": custom_id,
        "response": {
            "status_code": status_code,
            "request_id": request_id,
            "body": body if ok else None,
        },
        "error": None if ok else body,
    }


def error_line(bad: BadLine) -> dict[str, Any]:
    """The output line of a malformed input line: status 400 and the message, as vLLM."""
    return {
        "id": f"vllm-{new_id()}",
        "custom_id": bad.custom_id,
        "response": {"status_code": 400, "request_id": f"vllm-batch-{new_id()}", "body": None},
        "error": bad.message,
    }


def encode_line(record: dict[str, Any]) -> bytes:
    """One output line: compact JSON and a newline (text UTF-8 cannot carry is escaped)."""
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    return (text + "\n").encode("utf-8", "backslashreplace")
