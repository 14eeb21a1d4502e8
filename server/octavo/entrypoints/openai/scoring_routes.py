"""The scoring routes, as vLLM serves them: /score and /v1/score, /rerank, /v1/rerank and
/v2/rerank, /classify and /pooling (for models served with ``--runner pooling``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from octavo.entrypoints.openai.context import ServerContext, get_context
from octavo.entrypoints.openai.scoring.classify_serving import create_classify, create_pooling
from octavo.entrypoints.openai.scoring.protocol import (
    ClassificationRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from octavo.entrypoints.openai.scoring.serving import create_rerank, create_score

router = APIRouter()
Context = Annotated[ServerContext, Depends(get_context)]


@router.post("/score")
@router.post("/v1/score")
async def score(body: ScoreRequest, request: Request, context: Context) -> JSONResponse:
    return await create_score(body, request, context)


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(body: RerankRequest, request: Request, context: Context) -> JSONResponse:
    return await create_rerank(body, request, context)


@router.post("/classify")
async def classify(body: ClassificationRequest, request: Request, context: Context) -> JSONResponse:
    return await create_classify(body, request, context)


@router.post("/pooling")
async def pooling(body: PoolingRequest, request: Request, context: Context) -> JSONResponse:
    return await create_pooling(body, request, context)
