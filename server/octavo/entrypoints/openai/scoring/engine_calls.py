"""Submitting a route's pooling requests to the engine and waiting for all their vectors:
the path ``/v1/embeddings`` takes, shared by every pooling route."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fastapi import Request

from octavo.entrypoints.openai.context import ServerContext
from octavo.entrypoints.openai.disconnect import cancel_on_disconnect
from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.entrypoints.openai.middleware import request_ids
from octavo.entrypoints.openai.streaming import close_streams, open_streams
from octavo.lora_request import LoRARequest
from octavo.outputs import RequestOutput
from octavo.pooling.params import PoolingParams
from octavo.pooling.runner import RunnerSettings


async def pool_prompts(
    context: ServerContext,
    raw_request: Request,
    ids,
    prompts: list[list[int]],
    pooling: Sequence[PoolingParams],
    adapter: LoRARequest | None,
) -> list[RequestOutput]:
    """One engine request per prompt (``ids``: ``request_ids``' for this route), admitted
    together and batched with everything else; aborted if the client leaves. Every output
    has its vector (else 500 naming the request)."""
    runner = context.ready_info().runner
    params = [runner.check_params(each) for each in pooling]
    streams = await open_streams(
        context.engine, ids.engine, prompts, params, adapter, context.config.enable_log_requests
    )
    try:
        finals = await cancel_on_disconnect(
            raw_request, asyncio.gather(*(stream.final() for stream in streams))
        )
    finally:
        close_streams(streams)
    for final in finals:
        if final.pooled is None:  # the engine failed or aborted this prompt
            message = final.error or f"request {final.request_id} ended without a vector"
            raise APIError(500, message, code="request_failed")
    return finals


def route_ids(raw_request: Request, prefix: str, request_id: str | None):
    """The engine and response ids of this request (``request_id``: the client's own)."""
    return request_ids(raw_request.scope, prefix, request_id)


def check_task(runner: RunnerSettings, task: str) -> None:
    """400 naming ``--runner`` (or the right route) when this model cannot do ``task``."""
    try:
        runner.check_task(task)
    except ValueError as error:
        raise bad_request(str(error), param="model") from None
