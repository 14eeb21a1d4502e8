"""POST /v1/chat/completions: render the conversation, generate, stream or collect."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from octavo.engine.request_stream import RequestStream
from octavo.entrypoints.openai.context import ServerContext
from octavo.entrypoints.openai.disconnect import cancel_on_disconnect
from octavo.entrypoints.openai.logprobs_format import (
    TokenDecoder,
    all_logprobs,
    chat_logprobs,
    new_logprobs,
)
from octavo.entrypoints.openai.prompts import render_chat
from octavo.entrypoints.openai.protocol import ChatCompletionRequest
from octavo.entrypoints.openai.request_params import resolve_max_tokens, to_sampling_params
from octavo.entrypoints.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    DeltaMessage,
    Usage,
)
from octavo.entrypoints.openai.streaming import (
    close_streams,
    open_streams,
    sse_event,
    sse_frames,
    sse_response,
)
from octavo.entrypoints.openai.structured_outputs import checked_constraint
from octavo.outputs import CompletionOutput, RequestOutput


@dataclass
class ChatJob:
    body: ChatCompletionRequest
    response_id: str
    model_name: str
    num_prompt_tokens: int
    decoder: TokenDecoder
    tokens_by_choice: dict[int, int] = field(default_factory=dict)
    finished_choices: set[int] = field(default_factory=set)

    @property
    def num_top_logprobs(self) -> int | None:
        """``None`` = no logprobs; otherwise how many alternatives per token."""
        return (self.body.top_logprobs or 0) if self.body.logprobs else None

    def logprobs(self, entries: list) -> ChatLogprobs | None:
        top = self.num_top_logprobs
        return None if top is None else chat_logprobs(entries, self.decoder, top)

    def chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.response_id, model=self.model_name, choices=choices)


async def create_chat_completion(
    body: ChatCompletionRequest, raw_request: Request, context: ServerContext
) -> Response:
    context.check_model(body.model)
    info = context.ready_info()
    context.check_fan_out(body.n, info, "n")
    token_ids = await context.tokenizers.run(
        render_chat, body.messages, info, body.add_generation_prompt
    )
    max_tokens = resolve_max_tokens(
        body.requested_max_tokens, len(token_ids), info.max_model_len, None, "messages"
    )
    job = ChatJob(
        body=body,
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
        model_name=context.config.model_name,
        num_prompt_tokens=len(token_ids),
        decoder=context.decoder(),
    )
    constraint = await checked_constraint(body, info, context)
    params = to_sampling_params(body, max_tokens, job.num_top_logprobs, constraint)
    streams = await open_streams(context.engine, job.response_id, [token_ids], [params])
    if body.stream:
        return sse_response(_stream(job, streams[0]))
    try:
        final = await cancel_on_disconnect(raw_request, streams[0].final())
    finally:
        close_streams(streams)
    return JSONResponse(_full_response(job, final).model_dump())


# ----- non-streaming -------------------------------------------------------------------
def _full_response(job: ChatJob, final: RequestOutput) -> ChatCompletionResponse:
    choices = [
        ChatChoice(
            index=output.index,
            message=AssistantMessage(content=output.text),
            logprobs=job.logprobs(all_logprobs(output)),
            finish_reason=output.finish_reason,
            stop_reason=output.stop_reason,
        )
        for output in sorted(final.outputs, key=lambda output: output.index)
    ]
    generated = sum(len(output.token_ids) for output in final.outputs)
    response = ChatCompletionResponse(id=job.response_id, model=job.model_name, choices=choices)
    response.usage = Usage.of(job.num_prompt_tokens, generated)
    return response


# ----- streaming -----------------------------------------------------------------------
def _stream(job: ChatJob, stream: RequestStream) -> AsyncIterator[str]:
    usage = (lambda: sse_event(_usage_chunk(job))) if job.body.include_usage else None
    return sse_frames(_chunks(job, stream), usage, stream.close)


async def _chunks(job: ChatJob, stream: RequestStream) -> AsyncIterator[str]:
    exclude = None if job.body.include_usage else {"usage"}
    for index in range(job.body.n):
        role = DeltaMessage(role="assistant", content="")
        yield sse_event(job.chunk([ChatChunkChoice(index=index, delta=role)]), exclude)
    async for output in stream.outputs():
        for completion in output.outputs:
            choice = _delta_choice(job, completion)
            if choice is not None:
                yield sse_event(job.chunk([choice]), exclude=exclude)


def _delta_choice(job: ChatJob, output: CompletionOutput) -> ChatChunkChoice | None:
    if output.index in job.finished_choices:
        return None
    job.tokens_by_choice[output.index] = len(output.token_ids)
    if output.finished:
        job.finished_choices.add(output.index)
    wants_logprobs = job.num_top_logprobs is not None and bool(output.delta_token_ids)
    if not (output.delta_text or output.finished or wants_logprobs):
        return None
    return ChatChunkChoice(
        index=output.index,
        delta=DeltaMessage(content=output.delta_text or None),
        logprobs=job.logprobs(new_logprobs(output)),
        finish_reason=output.finish_reason,
        stop_reason=output.stop_reason,
    )


def _usage_chunk(job: ChatJob) -> ChatCompletionChunk:
    chunk = job.chunk([])
    chunk.usage = Usage.of(job.num_prompt_tokens, sum(job.tokens_by_choice.values()))
    return chunk
