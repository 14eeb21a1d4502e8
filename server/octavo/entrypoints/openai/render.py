"""``POST /v1/completions/render`` and ``/v1/chat/completions/render``: the engine inputs
a request would run with, without running it (vLLM's render endpoints).

An endpoint picker's token producer (the llm-d router's ``vllm`` tokenizer backend)
posts the request body it is routing and reads ``token_ids`` to score pods by the KV
blocks they hold. The answer must be exactly what the engine would run, so it comes
from the request path's own functions (``completion_inputs``, ``chat_inputs``): the
same chat template, template kwargs, tools, special tokens and checks. The per-request
limits hold here as there (prompts × n against ``--max-sequences-per-request``, checked
before anything is tokenized; each prompt against the context; the body's size), so a
render costs no more than the request itself would. Only compiling the output
constraint is left to the real request. (A render-only server has no KV cache: its
default sequence limit is ``--max-num-seqs``.)

The shape is vLLM's ``GenerateRequest``: one object for a chat request, a list of them
(one per prompt) for a completion request.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import Request
from pydantic import BaseModel

from octavo.entrypoints.openai.context import ServerContext
from octavo.entrypoints.openai.middleware import request_ids
from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequest,
)
from octavo.entrypoints.openai.serving_chat import chat_inputs
from octavo.entrypoints.openai.serving_completion import completion_inputs
from octavo.entrypoints.openai.streaming import engine_request_ids
from octavo.sampling_params import SamplingParams


class GenerateRequest(BaseModel):
    """One engine request, as vLLM's render endpoints describe it."""

    request_id: str
    token_ids: list[int]
    features: dict[str, Any] | None = None  # multimodal inputs: none here (text only)
    sampling_params: dict[str, Any]
    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    cache_salt: str | None = None
    priority: int = 0
    kv_transfer_params: dict[str, Any] | None = None


async def render_completion(
    body: CompletionRequest, raw_request: Request, context: ServerContext
) -> list[GenerateRequest]:
    inputs = await completion_inputs(body, context, admitting=False)
    base = request_ids(raw_request.scope, "cmpl", body.request_id).engine
    ids = engine_request_ids(base, len(inputs.prompts))
    return [
        generate_request(body, request_id, prompt.token_ids, params)
        for request_id, prompt, params in zip(ids, inputs.prompts, inputs.params, strict=True)
    ]


async def render_chat(
    body: ChatCompletionRequest, raw_request: Request, context: ServerContext
) -> GenerateRequest:
    inputs = await chat_inputs(body, context, admitting=False)
    request_id = request_ids(raw_request.scope, "chatcmpl", body.request_id).engine
    return generate_request(body, request_id, inputs.token_ids, inputs.params)


def generate_request(
    body: SamplingRequest, request_id: str, token_ids: list[int], params: SamplingParams
) -> GenerateRequest:
    options = body.stream_options.model_dump() if body.stream_options is not None else None
    return GenerateRequest(
        request_id=request_id,
        token_ids=token_ids,
        sampling_params=sampling_params_json(params),
        model=body.model,
        stream=body.stream,
        stream_options=options if body.stream else None,
        cache_salt=params.cache_salt,
        priority=body.priority,
    )


def sampling_params_json(params: SamplingParams) -> dict[str, Any]:
    """The engine's parameters with vLLM's field names (the output kind as its number,
    the constraint as its one set field; the cache salt is the request's, not here)."""
    values = {
        field.name: getattr(params, field.name)
        for field in dataclasses.fields(params)
        if field.name not in ("output_kind", "structured_outputs", "cache_salt")
    }
    constraint = params.structured_outputs
    if constraint is not None:
        spec = {name: value for name, value in dataclasses.asdict(constraint).items() if value}
        values["structured_outputs"] = spec
    else:
        values["structured_outputs"] = None
    values["output_kind"] = params.output_kind.value
    return values
