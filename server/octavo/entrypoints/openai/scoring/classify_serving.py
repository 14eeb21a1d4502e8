"""POST /classify (a classifier's class probabilities and label per input) and /pooling
(each input's pooled vector as the model gives it: an embedding, or a classifier's logits)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from octavo.entrypoints.openai.context import ServerContext
from octavo.entrypoints.openai.embeddings.inputs import embedding_inputs, input_items
from octavo.entrypoints.openai.scoring.engine_calls import check_task, pool_prompts, route_ids
from octavo.entrypoints.openai.scoring.protocol import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    PoolingData,
    PoolingRequest,
    PoolingResponse,
    usage_of,
)
from octavo.outputs import RequestOutput
from octavo.pooling.params import PoolingParams
from octavo.pooling.scoring import class_label, class_probabilities


async def create_classify(
    body: ClassificationRequest, raw_request: Request, context: ServerContext
) -> JSONResponse:
    finals, ids = await _pool_inputs(body, raw_request, context, "classify")
    labels = context.ready_info().runner.pooler.labels
    data = []
    for index, final in enumerate(finals):
        probs = class_probabilities(final.pooled)
        label = class_label(probs, labels)
        data.append(
            ClassificationData(index=index, label=label, probs=probs, num_classes=len(probs))
        )
    response = ClassificationResponse(
        id=ids.response, model=context.response_model(body.model), data=data, usage=_usage(finals)
    )
    return JSONResponse(response.model_dump())


async def create_pooling(
    body: PoolingRequest, raw_request: Request, context: ServerContext
) -> JSONResponse:
    finals, ids = await _pool_inputs(body, raw_request, context, "pooling")
    data = [PoolingData(index=index, data=final.pooled) for index, final in enumerate(finals)]
    response = PoolingResponse(
        id=ids.response, model=context.response_model(body.model), data=data, usage=_usage(finals)
    )
    return JSONResponse(response.model_dump())


async def _pool_inputs(
    body: ClassificationRequest, raw_request: Request, context: ServerContext, task: str
) -> tuple[list[RequestOutput], object]:
    """Every ``input`` tokenized as /v1/embeddings does, pooled with the model's defaults."""
    adapter = context.check_model(body.model)
    info = context.ready_info()
    check_task(info.runner, task)
    items = input_items(body.input)
    context.check_fan_out(len(items), info, "input")
    prompts = await context.tokenizers.run(embedding_inputs, body, items, info)
    ids = route_ids(raw_request, "classify" if task == "classify" else "pool", body.request_id)
    pooling = [PoolingParams()] * len(prompts)
    return await pool_prompts(context, raw_request, ids, prompts, pooling, adapter), ids


def _usage(finals: list[RequestOutput]):
    return usage_of(sum(final.num_prompt_tokens for final in finals))
