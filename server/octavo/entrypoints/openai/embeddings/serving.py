"""POST /v1/embeddings: each input becomes one pooling request; all are admitted together
and batched with everything else the engine runs (prefix cache included)."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse

from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.context import ServerContext
from octavo.entrypoints.openai.disconnect import cancel_on_disconnect
from octavo.entrypoints.openai.embeddings.inputs import embedding_inputs, input_items
from octavo.entrypoints.openai.embeddings.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.entrypoints.openai.middleware import request_ids
from octavo.entrypoints.openai.scoring.engine_calls import check_task
from octavo.entrypoints.openai.streaming import close_streams, open_streams
from octavo.outputs import RequestOutput
from octavo.pooling.params import PoolingParams
from octavo.sampling_params import SamplingParams


async def create_embedding(
    body: EmbeddingRequest, raw_request: Request, context: ServerContext
) -> JSONResponse:
    adapter = context.check_model(body.model)
    info = context.ready_info()
    check_task(info.runner, "embed")  # a classifier's vectors are logits: /classify
    params = _pooling_params(body, info)
    items = input_items(body.input)
    context.check_fan_out(len(items), info, "input")  # before anything is tokenized
    prompts = await context.tokenizers.run(embedding_inputs, body, items, info)
    ids = request_ids(raw_request.scope, "embd", body.request_id)
    streams = await open_streams(
        context.engine,
        ids.engine,
        prompts,
        [params] * len(prompts),
        adapter,
        context.config.enable_log_requests,
    )
    try:
        finals = await cancel_on_disconnect(
            raw_request, asyncio.gather(*(stream.final() for stream in streams))
        )
    finally:
        close_streams(streams)
    response = _response(body, ids.response, context.response_model(body.model), finals)
    return JSONResponse(response.model_dump())


def _pooling_params(body: EmbeddingRequest, info: EngineInfo) -> SamplingParams:
    """The request's pooling settings resolved against the model's (400 naming the field)."""
    try:
        pooling = PoolingParams(normalize=body.normalize, dimensions=body.dimensions)
        return info.runner.check_params(pooling)
    except ValueError as error:
        raise bad_request(str(error), param="dimensions") from None


def _response(
    body: EmbeddingRequest, response_id: str, model: str, finals: list[RequestOutput]
) -> EmbeddingResponse:
    data = [
        EmbeddingData(index=index, embedding=_encoded(final, body.encoding_format))
        for index, final in enumerate(finals)
    ]
    prompt_tokens = sum(final.num_prompt_tokens for final in finals)
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    return EmbeddingResponse(id=response_id, model=model, data=data, usage=usage)


def _encoded(final: RequestOutput, encoding_format: str) -> list[float] | str:
    if final.pooled is None:  # the engine failed or aborted this input
        message = final.error or f"request {final.request_id} ended without a vector"
        raise APIError(500, message, code="request_failed")
    if encoding_format == "float":
        return final.pooled
    return base64.b64encode(np.asarray(final.pooled, dtype="<f4").tobytes()).decode("ascii")
