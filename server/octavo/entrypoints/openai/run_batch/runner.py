"""Sending a batch file's lines through the server's app, concurrently, writing each result
as it finishes.

Every line goes through the same FastAPI app as ``octavo serve`` (``httpx.ASGITransport``,
no socket), so each URL answers exactly as the server would. Up to ``max_concurrency``
lines are in flight at once, so the engine batches them continuously.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from tqdm import tqdm

from octavo.engine.async_engine import AsyncEngine
from octavo.entrypoints.openai.app import context_of
from octavo.entrypoints.openai.errors import error_body
from octavo.entrypoints.openai.run_batch import output_file
from octavo.entrypoints.openai.run_batch.lines import (
    BadLine,
    BatchRequest,
    encode_line,
    error_line,
    new_id,
    parse_line,
    result_line,
)

logger = logging.getLogger(__name__)

READY_POLL_SECONDS = 0.1
FIRST_RETRY_SECONDS = 0.02  # a 429's first wait; doubled each time, up to
LAST_RETRY_SECONDS = 0.25  # (no network in between: a retry costs only a tokenization)
BASE_URL = "http://octavo-batch"


class RunFailed(Exception):
    """The run itself failed (the engine did not load, or died): the lines written so far
    stay, and a rerun does the rest."""


@dataclass(frozen=True)
class BatchSettings:
    input_path: Path
    output_path: Path
    tmp_dir: Path | None
    max_concurrency: int
    api_key: str | None = None
    progress: bool = True


@dataclass
class BatchSummary:
    lines: int = 0  # non-blank input lines
    already_done: int = 0  # skipped: their results were in the output
    written: int = 0  # result lines written by this run
    errors: int = 0  # of them, error lines


def input_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of ``path`` with their 1-based line numbers."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            if raw.strip():
                yield number, raw


def count_lines(path: Path) -> int:
    return sum(1 for _ in input_lines(path))


async def run_batch(app: FastAPI, settings: BatchSettings) -> BatchSummary:
    """Run every line of the input not yet in the output; publish the output when done."""
    working = output_file.working_file(settings.output_path, settings.tmp_dir)
    appender = output_file.DurableAppender(working)  # locked before it is read
    try:
        existing = output_file.read_existing(working)
        appender.truncate(existing.keep_bytes)
        async with app.router.lifespan_context(app):
            engine = context_of(app).engine
            await wait_until_ready(engine)
            summary = await BatchRun(app, engine, appender, settings).run(existing)
    finally:
        appender.close()
    output_file.publish(working, settings.output_path)
    return summary


async def wait_until_ready(engine: AsyncEngine) -> None:
    while engine.status == "loading":
        await asyncio.sleep(READY_POLL_SECONDS)
    if engine.status != "ready":
        raise RunFailed(f"the engine did not load ({engine.status}); see the log above")


class BatchRun:
    """One pass over the input file."""

    def __init__(
        self,
        app: FastAPI,
        engine: AsyncEngine,
        appender: output_file.DurableAppender,
        settings: BatchSettings,
    ) -> None:
        self._app, self._engine, self._appender = app, engine, appender
        self._settings = settings
        self.summary = BatchSummary(lines=count_lines(settings.input_path))
        self._progress: tqdm | None = None

    async def run(self, existing: output_file.Existing) -> BatchSummary:
        headers = {"Authorization": f"Bearer {self._settings.api_key}"}
        transport = httpx.ASGITransport(app=self._app, raise_app_exceptions=False)
        client = httpx.AsyncClient(
            transport=transport,
            base_url=BASE_URL,
            timeout=None,
            headers=headers if self._settings.api_key else None,
        )
        initial = min(sum(existing.done.values()), self.summary.lines)
        logger.info(
            "running %s: %d lines, %d results already in the output",
            self._settings.input_path,
            self.summary.lines,
            initial,
        )
        with self._make_progress(initial) as self._progress:
            async with client:
                await self._run_lines(client, Counter(existing.done))
        return self.summary

    def _make_progress(self, initial: int) -> tqdm:
        return tqdm(
            total=self.summary.lines,
            initial=initial,
            desc="run-batch",
            unit="line",
            file=sys.stderr,
            mininterval=0.5 if sys.stderr.isatty() else 10.0,
            disable=not self._settings.progress,
        )

    async def _run_lines(self, client: httpx.AsyncClient, to_skip: Counter[str]) -> None:
        """Start a task per line not already done, at most ``max_concurrency`` at once."""
        slots = asyncio.Semaphore(self._settings.max_concurrency)
        try:
            async with asyncio.TaskGroup() as group:
                for number, raw in input_lines(self._settings.input_path):
                    item = parse_line(raw, number)
                    if to_skip[item.custom_id] > 0:  # counted, so repeated ids resume right
                        to_skip[item.custom_id] -= 1
                        self.summary.already_done += 1
                        continue
                    await slots.acquire()
                    group.create_task(self._run_line(client, item, slots))
        except* RunFailed as failures:
            raise failures.exceptions[0] from None
        except* OSError as failures:  # the output could not be written (a full disk, ...)
            raise RunFailed(f"writing the results failed: {failures.exceptions[0]}") from None

    async def _run_line(
        self, client: httpx.AsyncClient, item: BatchRequest | BadLine, slots: asyncio.Semaphore
    ) -> None:
        """One line's result, written; its slot is free once the app has answered (the next
        line need not wait for this one's fsync)."""
        try:
            bad = isinstance(item, BadLine)
            record = error_line(item) if bad else await self._send(client, item)
        finally:
            slots.release()
        await self._appender.append(encode_line(record))
        self.summary.written += 1
        self.summary.errors += record["error"] is not None
        if self._progress is not None:
            self._progress.update()

    async def _send(self, client: httpx.AsyncClient, item: BatchRequest) -> dict[str, Any]:
        """The result line of one request; RunFailed if the engine is gone."""
        try:
            response = await self._post(client, item)
        except (RunFailed, asyncio.CancelledError):
            raise
        except Exception as error:  # one line's failure is its error line, not the run's
            logger.exception("line %d failed", item.line_number)
            body = error_body(f"the request failed: {error}", "internal_error")
            return result_line(item.custom_id, 500, f"vllm-batch-{new_id()}", body)
        if response.status_code >= 500 and self._engine.status != "ready":
            raise RunFailed(f"the engine stopped ({self._engine.status}); rerun to resume")
        request_id = response.headers.get("x-request-id") or f"vllm-batch-{new_id()}"
        return result_line(item.custom_id, response.status_code, request_id, _body(response))

    async def _post(self, client: httpx.AsyncClient, item: BatchRequest) -> httpx.Response:
        """POST the body; a full engine queue (429, ``--max-queue-len``) is waited out."""
        content = json.dumps(item.body).encode()
        delay = FIRST_RETRY_SECONDS
        while True:
            response = await client.post(
                item.url, content=content, headers={"Content-Type": "application/json"}
            )
            if response.status_code != 429 or self._engine.status != "ready":
                return response
            await asyncio.sleep(delay)
            delay = min(LAST_RETRY_SECONDS, 2 * delay)


def _body(response: httpx.Response) -> Any:
    """The response's JSON; a body that is not JSON is reported in OpenAI's error shape."""
    try:
        return response.json()
    except ValueError:
        message = response.text[:1000] or f"HTTP {response.status_code} with an empty body"
        return error_body(message, "internal_error")
