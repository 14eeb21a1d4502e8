"""Server-sent events and merging the output streams of several engine requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from octavo.engine.async_engine import AsyncEngine, EngineDead
from octavo.engine.core_messages import NewRequest
from octavo.engine.request_stream import RequestFailed, RequestStream, close_streams
from octavo.entrypoints.openai.errors import bad_request, error_body
from octavo.entrypoints.openai.middleware import request_arrival
from octavo.entrypoints.openai.request_log import log_finished, log_request
from octavo.entrypoints.openai.request_params import refused_field
from octavo.lora_request import LoRARequest
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams
from octavo.tracing import request_span_hook

if TYPE_CHECKING:
    from octavo.multimodal.processor import ProcessedPrompt

__all__ = ["close_streams"]  # re-exported for the serving modules

SSE_DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_END = object()


def sse_event(payload: BaseModel | dict[str, Any], exclude: set[str] | None = None) -> str:
    """One ``data:`` event carrying a JSON body."""
    if isinstance(payload, BaseModel):
        body = payload.model_dump_json(exclude=exclude)
    else:
        body = json.dumps(payload)
    return f"data: {body}\n\n"


async def sse_frames(
    chunks: AsyncIterator[str], usage: Callable[[], str] | None, close: Callable[[], None]
) -> AsyncIterator[str]:
    """The frame every streamed response shares: its chunks, the usage chunk if asked,
    `[DONE]`; an engine that died mid-stream, or that failed this request, becomes an
    error event; CLOSE runs always (aborting what is left)."""
    try:
        async for chunk in chunks:
            yield chunk
        if usage is not None:
            yield usage()
        yield SSE_DONE
    except EngineDead as error:
        yield sse_event(error_body(str(error), "internal_error", code="engine_dead"))
        yield SSE_DONE
    except RequestFailed as error:
        yield sse_event(error_body(str(error), "internal_error", code="request_failed"))
        yield SSE_DONE
    finally:
        close()


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yield ``(stream index, output)`` from several requests as their outputs arrive."""
    if len(streams) == 1:
        async for output in streams[0].outputs():
            yield 0, output
        return
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(i, s, inbox)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await inbox.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(index: int, stream: RequestStream, inbox: asyncio.Queue[Any]) -> None:
    try:
        async for output in stream.outputs():
            inbox.put_nowait((index, output))
    except Exception as error:
        inbox.put_nowait((index, error))
    inbox.put_nowait((index, _END))


def engine_request_ids(base_id: str, count: int) -> list[str]:
    """The engine request ids of an HTTP request's ``count`` prompts."""
    return [base_id] if count == 1 else [f"{base_id}-{i}" for i in range(count)]


async def open_streams(
    engine: AsyncEngine,
    base_id: str,
    prompts: list[list[int] | ProcessedPrompt],
    params: list[SamplingParams],
    lora_request: LoRARequest | None = None,
    log_requests: bool = False,
) -> list[RequestStream]:
    """One engine request per prompt, all admitted in one command (or none of them);
    ``log_requests``: a log line for each (``--enable-log-requests``)."""
    ids = engine_request_ids(base_id, len(prompts))
    if log_requests:
        for request_id, prompt, sampling in zip(ids, prompts, params, strict=True):
            token_ids = prompt if isinstance(prompt, list) else prompt.token_ids
            log_request(request_id, token_ids, sampling, lora_request)
    requests = [
        NewRequest(request_id, token_ids, sampling, lora_request)
        for request_id, token_ids, sampling in zip(ids, prompts, params, strict=True)
    ]
    try:
        streams = await engine.add_requests(base_id, requests, request_arrival.get())
    except ValueError as error:  # the engine refused a prompt or a sampling field
        raise bad_request(str(error), param=refused_field(str(error), "prompt")) from None
    for stream, sampling in zip(streams, params, strict=True):
        stream.on_finish = finish_hook(log_requests, request_span_hook(sampling, lora_request))
    return streams


def finish_hook(
    log_requests: bool, span_hook: Callable[[RequestOutput], None] | None
) -> Callable[[RequestOutput], None] | None:
    """What runs when an engine request finishes: the request logger's line
    (``--enable-log-requests``), its span (``--otlp-traces-endpoint``), both, or nothing."""
    hooks = [hook for hook in (log_finished if log_requests else None, span_hook) if hook]
    if len(hooks) <= 1:
        return hooks[0] if hooks else None

    def run_all(output: RequestOutput) -> None:
        for hook in hooks:
            hook(output)

    return run_all
