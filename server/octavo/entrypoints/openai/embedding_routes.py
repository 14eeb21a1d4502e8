"""The embeddings route (``/v1/embeddings``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from octavo.entrypoints.openai.context import ServerContext, get_context
from octavo.entrypoints.openai.embeddings.protocol import EmbeddingRequest
from octavo.entrypoints.openai.embeddings.serving import create_embedding

router = APIRouter()
Context = Annotated[ServerContext, Depends(get_context)]


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request, context: Context) -> JSONResponse:
    return await create_embedding(body, request, context)
