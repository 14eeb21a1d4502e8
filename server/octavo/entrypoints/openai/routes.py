"""The /v1 routes: completions and chat completions (``router``), their render endpoints
(``render_router``) and the model list (``models_router``); a render-only server
(``octavo launch render``) serves the last two."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from octavo.entrypoints.openai.context import ServerContext, get_context
from octavo.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from octavo.entrypoints.openai.render import GenerateRequest, render_chat, render_completion
from octavo.entrypoints.openai.responses import ModelCard, ModelList
from octavo.entrypoints.openai.serving_chat import create_chat_completion
from octavo.entrypoints.openai.serving_completion import create_completion

router = APIRouter()
render_router = APIRouter()
models_router = APIRouter()
Context = Annotated[ServerContext, Depends(get_context)]


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, context: Context) -> Response:
    return await create_completion(body, request, context)


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, context: Context
) -> Response:
    return await create_chat_completion(body, request, context)


@render_router.post("/v1/completions/render")
async def completions_render(
    body: CompletionRequest, request: Request, context: Context
) -> list[GenerateRequest]:
    return await render_completion(body, request, context)


@render_router.post("/v1/chat/completions/render")
async def chat_completions_render(
    body: ChatCompletionRequest, request: Request, context: Context
) -> GenerateRequest:
    return await render_chat(body, request, context)


@models_router.get("/v1/models")
async def models(context: Context) -> ModelList:
    info = context.engine.info
    max_model_len = info.max_model_len if info is not None else None
    root = context.config.model_root
    cards = [
        ModelCard(id=name, root=root, max_model_len=max_model_len)
        for name in context.config.served_model_names
    ]
    parent = context.config.model_name
    for name, adapter in context.adapters().by_name.items():
        card = ModelCard(
            id=name, root=adapter.lora_path, parent=parent, max_model_len=max_model_len
        )
        cards.append(card)
    return ModelList(data=cards)
