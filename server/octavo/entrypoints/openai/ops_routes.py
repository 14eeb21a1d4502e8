"""Operational routes outside /v1: health, metrics, version, tokenize and detokenize."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

import octavo
from octavo.entrypoints.openai.context import ServerContext, get_context
from octavo.entrypoints.openai.errors import APIError
from octavo.entrypoints.openai.prompts import detokenize_ids, render_chat, tokenize_text
from octavo.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from octavo.entrypoints.openai.responses import (
    DetokenizeResponse,
    HealthResponse,
    TokenizeResponse,
    VersionResponse,
)
from octavo.inputs.chat import ChatOptions
from octavo.progress import PhaseProgress

router = APIRouter()
WARMING_GRAMMARS = PhaseProgress("warming up structured output", 0, None, "steps", 0.0)
Context = Annotated[ServerContext, Depends(get_context)]


@router.get("/health", response_model=HealthResponse)
async def health(context: Context) -> Response:
    """200 only while the engine loop is alive and taking requests (and, in the served
    app, once the structured-output compiler has warmed up); 503 otherwise, while loading
    with the phase and its percent (``loading_response``)."""
    engine = context.engine
    if engine.draining:
        raise APIError(503, "the server is shutting down", code="draining")
    if engine.status == "loading":
        return loading_response(engine.load_progress)
    if not engine.is_ready:
        raise APIError(503, f"the engine is not ready ({engine.status})", code=engine.status)
    if context.grammars.warming:
        return loading_response(WARMING_GRAMMARS)
    return HealthResponse(status="ok")


def loading_response(progress: PhaseProgress | None) -> JSONResponse:
    """503 ``{"status": "loading", "phase": "loading weights", "percent": 42.0, "error":
    {...}}``: the phase the engine core last reported (``octavo.progress``) and its percent
    (null when its size is unknown, or before the first report), beside the usual error."""
    phase = progress.phase if progress is not None else "starting"
    percent = progress.percent if progress is not None else None
    error = APIError(503, f"the model is loading ({phase})", code="loading").body()
    body = {"status": "loading", "phase": phase, "percent": percent, **error}
    return JSONResponse(body, status_code=503)


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
        options = ChatOptions(
            add_generation_prompt=body.add_generation_prompt,
            chat_template=context.config.chat_template,
            tool_prompt_fallback=context.config.tool_prompt_fallback,
        )
        work = (render_chat, body.messages, info, True, None, options)
    else:
        work = (tokenize_text, body.prompt, info, body.add_special_tokens)
    tokens = await context.tokenizers.run(*work)
    if not isinstance(tokens, list):  # messages with images: the expanded prompt
        tokens = tokens.token_ids
    return TokenizeResponse(count=len(tokens), max_model_len=info.max_model_len, tokens=tokens)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, context: Context) -> DetokenizeResponse:
    context.check_model(body.model)
    info = context.ready_info()
    text = await context.tokenizers.run(detokenize_ids, body.tokens, info)
    return DetokenizeResponse(prompt=text)
