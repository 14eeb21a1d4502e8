"""How Octavo's processes log: human-readable lines (the default) or, with
``--log-format json`` (``OCTAVO_LOG_FORMAT=json``), one JSON object per line for log
pipelines. A JSON line has ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
the process's ``rank`` where a worker logs, any request fields a log call attached
(``REQUEST_FIELDS``: request id, adapter, token counts, timings) and ``exception`` with the
traceback. The API process sets the variable, so the engine core and the workers it
starts log the same way."""

from __future__ import annotations

import datetime
import json
import logging
import os

LOG_FORMAT_ENV = "OCTAVO_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REQUEST_FIELDS = (
    "request_id",
    "adapter",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "finish_reason",
    "max_tokens",
    "queue_s",
    "ttft_s",
    "e2e_s",
    "rank",
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line = {
            "time": stamp.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in REQUEST_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def chosen_format(explicit: str | None = None) -> str:
    """``explicit`` (a ``--log-format`` value), else ``$OCTAVO_LOG_FORMAT``, else text."""
    chosen = (explicit or os.environ.get(LOG_FORMAT_ENV) or "text").lower()
    if chosen not in LOG_FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {chosen!r}")
    return chosen


def configure_logging(
    level: str | int,
    text_format: str = TEXT_FORMAT,
    kind: str | None = None,
    rank: int | None = None,
) -> None:
    """The root logger's one handler (standard error) in the chosen format; the choice is
    passed on to child processes through ``$OCTAVO_LOG_FORMAT``. ``rank``: a worker's,
    put on each of its records."""
    kind = chosen_format(kind)
    os.environ[LOG_FORMAT_ENV] = kind
    root = logging.getLogger()
    for existing in [h for h in root.handlers if getattr(h, "octavo", False)]:
        root.removeHandler(existing)
    if root.handlers and kind == "text":
        return  # someone else's handlers (a host program, pytest): as logging.basicConfig
    handler = logging.StreamHandler()
    handler.octavo = True
    handler.setFormatter(JsonFormatter() if kind == "json" else logging.Formatter(text_format))
    if rank is not None:
        handler.addFilter(_RankFilter(rank))
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True
