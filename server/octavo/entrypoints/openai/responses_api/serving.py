"""``POST /v1/responses`` through the chat completion pipeline; ``GET`` / ``DELETE`` /
``cancel`` on the stored responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from octavo.engine.async_engine import EngineDead
from octavo.engine.request_stream import RequestFailed, RequestStream
from octavo.entrypoints.openai.context import ServerContext
from octavo.entrypoints.openai.disconnect import cancel_on_disconnect
from octavo.entrypoints.openai.errors import APIError
from octavo.entrypoints.openai.protocol import ChatMessage
from octavo.entrypoints.openai.request_params import with_transfer_params
from octavo.entrypoints.openai.responses import AssistantMessage, ChatChunkChoice
from octavo.entrypoints.openai.responses_api.conversion import (
    ChatConversion,
    output_messages,
    responses_param,
    to_chat_request,
)
from octavo.entrypoints.openai.responses_api.events import ResponseEvents
from octavo.entrypoints.openai.responses_api.input_listing import listed_items
from octavo.entrypoints.openai.responses_api.objects import (
    FunctionCallItem,
    ItemStatus,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponseUsage,
)
from octavo.entrypoints.openai.responses_api.protocol import ResponsesRequest
from octavo.entrypoints.openai.responses_api.store import ResponseStore, StoredResponse
from octavo.entrypoints.openai.serving_chat import (
    ChatJob,
    delta_choices,
    full_choice,
    start_chat_job,
)
from octavo.entrypoints.openai.streaming import close_streams, sse_response


@dataclass
class ResponseRun:
    """One response being generated: the request, its chat job, what it is chained to."""

    body: ResponsesRequest
    conversion: ChatConversion
    job: ChatJob
    response: ResponseObject
    store: ResponseStore
    tokenizer: Any

    def usage(self, output_tokens: int) -> ResponseUsage:
        """``reasoning_tokens``: the reasoning text's length in tokens, re-encoded (the
        parser splits text, not tokens), at most the tokens generated."""
        reasoning = "".join(
            part.text
            for item in self.response.output
            if isinstance(item, ReasoningItem)
            for part in item.content
        )
        encoded = self.tokenizer.encode(reasoning, add_special_tokens=False) if reasoning else []
        reasoning_tokens = min(len(encoded), output_tokens)
        cached = self.job.num_cached_tokens
        return ResponseUsage.of(self.job.num_prompt_tokens, output_tokens, cached, reasoning_tokens)

    def remember(self) -> None:
        """Kept for ``GET`` and chaining, unless the request said ``store: false``."""
        if self.body.store:
            history = [*self.conversion.history, *output_messages(self.response.output)]
            items = listed_items(self.body.input)
            self.store.put(StoredResponse(self.response, history, items))


def response_store(app: FastAPI) -> ResponseStore:
    """The app's store (one per served app), made on first use."""
    store = getattr(app.state, "responses_store", None)
    if store is None:
        store = app.state.responses_store = ResponseStore()
    return store


def stored(store: ResponseStore, response_id: str) -> StoredResponse:
    entry = store.get(response_id)
    if entry is None:
        raise APIError(404, f"Response with id {response_id!r} not found.", param="response_id")
    return entry


def earlier_turns(body: ResponsesRequest, store: ResponseStore) -> list[ChatMessage]:
    """The conversation ``previous_response_id`` continues (400 if it is not stored)."""
    if body.previous_response_id is None:
        return []
    entry = store.get(body.previous_response_id)
    if entry is None and prefills_for_remote_decode(body):
        # a prefill pod never saw the turn a decode pod stored: a 5xx makes the llm-d
        # routing sidecar fall back to a whole request on its decode pod, which has it
        raise APIError(
            503,
            f"Previous response with id {body.previous_response_id!r} is not stored on "
            "this prefill server; decode it where it is stored.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if entry is None:
        raise APIError(
            400,
            f"Previous response with id {body.previous_response_id!r} not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return entry.history


async def create_response(
    body: ResponsesRequest, raw_request: Request, context: ServerContext
) -> Response:
    store = response_store(raw_request.app)
    conversion = to_chat_request(body, earlier_turns(body, store))
    try:
        job, streams = await start_chat_job(conversion.chat, raw_request, context, "resp")
    except APIError as error:
        error.param = responses_param(error.param)
        raise
    response = new_response(body, job.model_name)
    run = ResponseRun(body, conversion, job, response, store, context.ready_info().tokenizer)
    if body.stream:
        return sse_response(_events(run, streams[0]))
    try:
        final = await cancel_on_disconnect(raw_request, streams[0].final())
    finally:
        close_streams(streams)
    job.num_cached_tokens = final.num_cached_tokens
    (output,) = final.outputs
    choice = full_choice(job, output)
    cut_short = choice.finish_reason == "length"
    response.output = output_items(choice.message, "incomplete" if cut_short else "completed")
    response.finish(run.usage(len(output.token_ids)), cut_short)
    if not prefills_for_remote_decode(body):
        run.remember()  # a prefill's one-token answer is thrown away by the sidecar
    return JSONResponse(with_transfer_params(response.model_dump(), [final]))


def prefills_for_remote_decode(body: ResponsesRequest) -> bool:
    """The request is a P/D prefill (``kv_transfer_params.do_remote_decode``)."""
    params = body.kv_transfer_params
    return isinstance(params, dict) and params.get("do_remote_decode") is True


def new_response(body: ResponsesRequest, model: str) -> ResponseObject:
    """The response, in progress, echoing the request's settings."""
    text = body.text if body.text and body.text.get("format") else {"format": {"type": "text"}}
    return ResponseObject(
        status="in_progress",
        model=model,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        tool_choice=body.tool_choice or "auto",  # as OpenAI echoes it
        tools=body.tools or [],
        text=text,
        reasoning=body.reasoning,
        previous_response_id=body.previous_response_id,
        store=body.store,
        metadata=body.metadata or {},
        user=body.user,
    )


def output_items(message: AssistantMessage, status: ItemStatus) -> list[OutputItem]:
    """A finished chat reply as output items: reasoning, the message, the calls."""
    items: list[OutputItem] = []
    if message.reasoning is not None:
        items.append(ReasoningItem(content=[ReasoningText(text=message.reasoning)], status=status))
    calls = [
        FunctionCallItem(
            call_id=call.id,
            name=call.function.name,
            arguments=call.function.arguments,
            status=status,
        )
        for call in message.tool_calls or []
    ]
    if message.content or not calls:
        items.append(MessageItem(content=[OutputText(text=message.content or "")], status=status))
    return items + calls


async def _events(run: ResponseRun, stream: RequestStream) -> AsyncIterator[str]:
    events = ResponseEvents(run.response)
    try:
        for frame in events.start():
            yield frame
        cut_short = False
        async for output in stream.outputs():
            run.job.num_cached_tokens = output.num_cached_tokens
            for completion in output.outputs:
                for choice in delta_choices(run.job, completion):
                    cut_short = cut_short or _cut_short(choice)
                    for frame in events.delta(choice.delta):
                        yield frame
        usage = run.usage(sum(run.job.tokens_by_choice.values()))
        for frame in events.finish(usage, cut_short):
            yield frame
        run.remember()
    except EngineDead as error:
        yield events.error(str(error), "engine_dead")
    except RequestFailed as error:
        yield events.error(str(error), "request_failed")
    finally:
        stream.close()


def _cut_short(choice: ChatChunkChoice) -> bool:
    return choice.finish_reason == "length"


def deleted(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response.deleted", "deleted": True}
