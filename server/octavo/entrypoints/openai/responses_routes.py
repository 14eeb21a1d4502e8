"""The Responses API routes (``/v1/responses``); see ``responses_api/``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from octavo.entrypoints.openai.context import ServerContext, get_context
from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.entrypoints.openai.responses_api.input_listing import page
from octavo.entrypoints.openai.responses_api.protocol import ResponsesRequest
from octavo.entrypoints.openai.responses_api.serving import (
    create_response,
    deleted,
    response_store,
    stored,
)

router = APIRouter()
Context = Annotated[ServerContext, Depends(get_context)]


@router.post("/v1/responses")
async def responses_create(body: ResponsesRequest, request: Request, context: Context) -> Response:
    return await create_response(body, request, context)


@router.get("/v1/responses/{response_id}")
async def responses_retrieve(
    response_id: str, request: Request, stream: bool = False
) -> dict[str, Any]:
    if stream:
        raise bad_request("a stored response cannot be streamed again", param="stream")
    return stored(response_store(request.app), response_id).response.model_dump()


@router.get("/v1/responses/{response_id}/input_items")
async def responses_input_items(
    response_id: str,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
    before: str | None = None,
) -> dict[str, Any]:
    entry = stored(response_store(request.app), response_id)
    return page(entry.input_items, limit, order, after, before)


@router.delete("/v1/responses/{response_id}")
async def responses_delete(response_id: str, request: Request) -> dict[str, Any]:
    store = response_store(request.app)
    stored(store, response_id)  # 404 when unknown
    store.delete(response_id)
    return deleted(response_id)


@router.post("/v1/responses/{response_id}/cancel")
async def responses_cancel(response_id: str, request: Request) -> dict[str, Any]:
    """Only background responses can be cancelled, and this server runs none."""
    stored(response_store(request.app), response_id)  # 404 when unknown
    raise APIError(
        400, "Only responses created with background=true can be cancelled.", param="response_id"
    )
