"""Operational routes outside /v1: health, metrics, version, tokenize and detokenize."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST

import octavo
from octavo.entrypoints.openai.context import ServerContext, get_context
from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.entrypoints.openai.prompts import render_chat
from octavo.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from octavo.entrypoints.openai.responses import (
    DetokenizeResponse,
    HealthResponse,
    TokenizeResponse,
    VersionResponse,
)

router = APIRouter()
Context = Annotated[ServerContext, Depends(get_context)]


@router.get("/health")
async def health(context: Context) -> HealthResponse:
    """200 only while the engine loop is alive and taking requests; 503 otherwise."""
    engine = context.engine
    if engine.draining:
        raise APIError(503, "the server is shutting down", code="draining")
    if not engine.is_ready:
        raise APIError(503, f"the engine is not ready ({engine.status})", code=engine.status)
    return HealthResponse(status="ok")


@router.get("/metrics")
async def metrics(context: Context) -> Response:
    return Response(context.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/version")
async def version() -> VersionResponse:
    return VersionResponse(version=octavo.__version__)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, context: Context) -> TokenizeResponse:
    context.check_model(body.model)
    info = context.ready_info()
    if body.messages is not None:
        tokens = render_chat(body.messages, info.tokenizer, body.add_generation_prompt)
    else:
        tokens = info.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return TokenizeResponse(count=len(tokens), max_model_len=info.max_model_len, tokens=tokens)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, context: Context) -> DetokenizeResponse:
    context.check_model(body.model)
    info = context.ready_info()
    if any(not 0 <= token < info.tokenizer_size for token in body.tokens):
        raise bad_request(f"token ids must be in [0, {info.tokenizer_size})", param="tokens")
    return DetokenizeResponse(prompt=info.tokenizer.decode(body.tokens))
