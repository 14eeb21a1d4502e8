"""POST /v1/chat/completions: render the conversation, generate, stream or collect."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from octavo.engine.engine_info import EngineInfo
from octavo.engine.request_stream import RequestStream
from octavo.entrypoints.openai.context import ServerConfig, ServerContext
from octavo.entrypoints.openai.disconnect import cancel_on_disconnect
from octavo.entrypoints.openai.harmony.choices import HarmonyChoices
from octavo.entrypoints.openai.harmony.mode import harmony_choices, harmony_params, speaks_harmony
from octavo.entrypoints.openai.harmony.render import render_harmony
from octavo.entrypoints.openai.logprobs_format import (
    TokenDecoder,
    all_logprobs,
    chat_logprobs,
    new_logprobs,
)
from octavo.entrypoints.openai.middleware import request_ids
from octavo.entrypoints.openai.prompts import render_chat
from octavo.entrypoints.openai.protocol import ChatCompletionRequest
from octavo.entrypoints.openai.reasoning.plan import ReasoningPlan, Split, plan_reasoning
from octavo.entrypoints.openai.request_params import (
    resolve_max_tokens,
    to_sampling_params,
    with_transfer_params,
)
from octavo.entrypoints.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    DeltaMessage,
    FunctionCallOut,
    ToolCallOut,
    Usage,
)
from octavo.entrypoints.openai.streaming import (
    close_streams,
    open_streams,
    sse_event,
    sse_frames,
    sse_response,
)
from octavo.entrypoints.openai.structured_outputs import checked_constraint, chosen_constraint
from octavo.entrypoints.openai.tool_calls.parsers import ToolCallParse
from octavo.entrypoints.openai.tool_calls.plan import (
    ToolPlan,
    finish_reason_with_calls,
    new_call_id,
    plan_tools,
)
from octavo.entrypoints.openai.tool_calls.stream import ToolCallStream
from octavo.inputs.chat import ChatOptions
from octavo.inputs.tool_prompt import AUTO, ToolChoice
from octavo.lora_request import LoRARequest
from octavo.multimodal.processor import ProcessedPrompt
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling_params import SamplingParams


@dataclass
class ChatJob:
    body: ChatCompletionRequest
    response_id: str
    model_name: str
    num_prompt_tokens: int
    decoder: TokenDecoder
    role: str = "assistant"  # of the response's message
    report_cached: bool = False  # --enable-prompt-tokens-details
    num_cached_tokens: int = 0
    tools: ToolPlan = field(default_factory=lambda: ToolPlan("none"))
    reasoning: ReasoningPlan = field(default_factory=ReasoningPlan)
    tokens_by_choice: dict[int, int] = field(default_factory=dict)
    finished_choices: set[int] = field(default_factory=set)
    tool_streams: dict[int, ToolCallStream] = field(default_factory=dict)
    harmony: HarmonyChoices | None = None  # a Harmony model's replies (harmony/choices.py)

    def tool_stream(self, index: int) -> ToolCallStream:
        if index not in self.tool_streams:
            self.tool_streams[index] = ToolCallStream(self.tools)
        return self.tool_streams[index]

    @property
    def num_top_logprobs(self) -> int | None:
        return num_top_logprobs(self.body)

    def logprobs(self, entries: list) -> ChatLogprobs | None:
        top = self.num_top_logprobs
        return None if top is None else chat_logprobs(entries, self.decoder, top)

    def chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.response_id, model=self.model_name, choices=choices)

    def usage(self, completion_tokens: int) -> Usage:
        cached = self.num_cached_tokens if self.report_cached else None
        return Usage.of(self.num_prompt_tokens, completion_tokens, cached)


def chat_options(
    body: ChatCompletionRequest, config: ServerConfig, tool_choice: ToolChoice = AUTO
) -> ChatOptions:
    """How the request's conversation is rendered (vLLM's request fields)."""
    return ChatOptions(
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        chat_template=config.chat_template,
        template_kwargs=template_kwargs(body, config),
        tool_prompt_fallback=config.tool_prompt_fallback,
        tool_choice=tool_choice,
    )


def template_kwargs(body: ChatCompletionRequest, config: ServerConfig) -> dict[str, Any]:
    """``--default-chat-template-kwargs``, then the request's ``chat_template_kwargs`` over
    them (as vLLM merges them); the request's ``reasoning_effort`` is one of them."""
    effort = {"reasoning_effort": body.reasoning_effort} if body.reasoning_effort else {}
    defaults = config.default_chat_template_kwargs or {}
    return {**defaults, **effort, **(body.chat_template_kwargs or {})}


def response_role(body: ChatCompletionRequest, config: ServerConfig) -> str:
    """``--response-role`` when a new message is started, else the continued one's role."""
    if body.add_generation_prompt:
        return config.response_role
    return "system" if body.messages[-1].role == "developer" else body.messages[-1].role


@dataclass
class ChatInputs:
    """What the engine is given for a chat request: the rendered prompt and parameters."""

    adapter: LoRARequest | None
    info: EngineInfo
    tools: ToolPlan
    token_ids: list[int]
    params: SamplingParams
    engine_prompt: list[int] | ProcessedPrompt  # the token ids, or with images the prompt
    harmony: bool = False  # rendered by openai-harmony, its replies read as Harmony


async def chat_inputs(
    body: ChatCompletionRequest, context: ServerContext, admitting: bool = True
) -> ChatInputs:
    """The request checked and rendered into engine inputs (the render endpoint's answer).

    The per-request limits (``n``, the conversation's length) hold for a render too.
    ``admitting``: the request is about to run, so its constraint is compiled too.
    """
    adapter = context.check_model(body.model)
    info = context.ready_info()
    context.check_fan_out(body.n, info, "n")
    context.check_logprobs(body.top_logprobs if body.logprobs else None, "top_logprobs")
    config = context.config
    tools = plan_tools(body, config.enable_auto_tool_choice, config.tool_call_parser)
    options = chat_options(body, config, tools.prompt_choice())
    harmony = speaks_harmony(info.architecture, config.reasoning_parser, config.tool_call_parser)
    rendered = await context.tokenizers.run(
        render_harmony if harmony else render_chat,
        body.messages,
        info,
        True,
        tools.template_tools(),
        options,
    )
    token_ids = rendered.token_ids if isinstance(rendered, ProcessedPrompt) else rendered
    defaults = config.sampling_defaults
    max_tokens = resolve_max_tokens(
        body.requested_max_tokens,
        len(token_ids),
        info.max_model_len,
        defaults.get("max_tokens"),
        "messages",
    )
    if admitting:
        constraint = await checked_constraint(body, info, context, tools.constraint())
    else:
        constraint = chosen_constraint(body, tools.constraint())
    params = to_sampling_params(
        body, max_tokens, num_top_logprobs(body), constraint, defaults=defaults
    )
    if harmony:
        params = harmony_params(params, info.tokenizer)
    return ChatInputs(adapter, info, tools, token_ids, params, rendered, harmony)


def num_top_logprobs(body: ChatCompletionRequest) -> int | None:
    """``None`` = no logprobs; otherwise how many alternatives per token."""
    return (body.top_logprobs or 0) if body.logprobs else None


async def create_chat_completion(
    body: ChatCompletionRequest, raw_request: Request, context: ServerContext
) -> Response:
    job, streams = await start_chat_job(body, raw_request, context, "chatcmpl")
    if body.stream:
        return sse_response(_stream(job, streams[0]))
    try:
        final = await cancel_on_disconnect(raw_request, streams[0].final())
    finally:
        close_streams(streams)
    return JSONResponse(with_transfer_params(_full_response(job, final).model_dump(), [final]))


async def start_chat_job(
    body: ChatCompletionRequest, raw_request: Request, context: ServerContext, prefix: str
) -> tuple[ChatJob, list[RequestStream]]:
    """The request rendered, planned (tools, reasoning) and admitted to the engine: its
    job and its engine streams (the Responses API runs its requests through this too)."""
    inputs = await chat_inputs(body, context)
    config, info, token_ids = context.config, inputs.info, inputs.token_ids
    ids = request_ids(raw_request.scope, prefix, body.request_id)
    job = ChatJob(
        body=body,
        response_id=ids.response,
        model_name=context.response_model(body.model),
        num_prompt_tokens=len(token_ids),
        decoder=context.decoder(),
        role=response_role(body, config),
        report_cached=config.enable_prompt_tokens_details,
        tools=inputs.tools,
    )
    job.reasoning = plan_reasoning(
        config.reasoning_parser,
        info.tokenizer,
        token_ids,
        template_kwargs(body, config),
        constrained=inputs.params.structured_outputs is not None,
        include=body.include_reasoning,
    )
    if inputs.harmony:
        job.harmony = harmony_choices(inputs.tools, body.include_reasoning)
    streams = await open_streams(
        context.engine,
        ids.engine,
        [inputs.engine_prompt],
        [inputs.params],
        inputs.adapter,
        config.enable_log_requests,
    )
    return job, streams


# ----- non-streaming -------------------------------------------------------------------
def _full_response(job: ChatJob, final: RequestOutput) -> ChatCompletionResponse:
    choices = [full_choice(job, output) for output in sorted(final.outputs, key=lambda o: o.index)]
    generated = sum(len(output.token_ids) for output in final.outputs)
    response = ChatCompletionResponse(id=job.response_id, model=job.model_name, choices=choices)
    job.num_cached_tokens = final.num_cached_tokens
    response.usage = job.usage(generated)
    return response


def full_choice(job: ChatJob, output: CompletionOutput) -> ChatChoice:
    if job.harmony is not None:
        return job.harmony.full_choice(job, output)
    split = job.reasoning.whole(output.text)  # tool calls are read from the content only
    parsed = ToolCallParse(None) if split.content is None else job.tools.read(split.content)
    calls = [
        ToolCallOut(id=new_call_id(), function=FunctionCallOut(name=c.name, arguments=c.arguments))
        for c in parsed.calls
    ]
    return ChatChoice(
        index=output.index,
        message=AssistantMessage.with_reasoning(
            split.reasoning, role=job.role, content=parsed.content, tool_calls=calls
        ),
        logprobs=job.logprobs(all_logprobs(output)),
        finish_reason=finish_reason_with_calls(calls, output.finish_reason),
        stop_reason=output.stop_reason,
    )


# ----- streaming -----------------------------------------------------------------------
def _stream(job: ChatJob, stream: RequestStream) -> AsyncIterator[str]:
    usage = (lambda: sse_event(_usage_chunk(job))) if job.body.include_usage else None
    return sse_frames(_chunks(job, stream), usage, stream.close)


async def _chunks(job: ChatJob, stream: RequestStream) -> AsyncIterator[str]:
    exclude = None if job.body.include_usage else {"usage"}
    for index in range(job.body.n):
        role = DeltaMessage(role=job.role, content="")
        yield sse_event(job.chunk([ChatChunkChoice(index=index, delta=role)]), exclude)
    async for output in stream.outputs():
        job.num_cached_tokens = output.num_cached_tokens
        for completion in output.outputs:
            for choice in delta_choices(job, completion):
                yield sse_event(job.chunk([choice]), exclude=exclude)


def delta_choices(job: ChatJob, output: CompletionOutput) -> list[ChatChunkChoice]:
    """The chunks this output update makes: its delta (reasoning, content, or a tool call's
    piece), and, once it finished, what the reasoning and tool-call streams kept back, then
    the finish reason."""
    if job.harmony is not None:
        return job.harmony.delta_choices(job, output)
    if output.index in job.finished_choices:
        return []
    job.tokens_by_choice[output.index] = len(output.token_ids)
    stream = job.tool_stream(output.index)
    pieces = [_message_delta(stream, job.reasoning.delta(output.index, output.delta_text))]
    logprobs = job.logprobs(new_logprobs(output)) if job.tools.mode == "none" else None
    if output.finished:
        job.finished_choices.add(output.index)
        pieces.append(_message_delta(stream, job.reasoning.finish(output.index)))
        pieces += stream.finish()
    pieces = [piece for piece in pieces if piece is not None]
    if not pieces and logprobs is not None:
        pieces = [DeltaMessage()]
    choices = [  # the update's logprobs go with its first piece only
        ChatChunkChoice(index=output.index, delta=piece, logprobs=logprobs if i == 0 else None)
        for i, piece in enumerate(pieces)
    ]
    if output.finished:
        if not choices:
            choices.append(ChatChunkChoice(index=output.index, delta=DeltaMessage()))
        calls = range(stream.num_calls)
        choices[-1].finish_reason = finish_reason_with_calls(calls, output.finish_reason)
        choices[-1].stop_reason = output.stop_reason
    return choices


_delta_choices = delta_choices  # the older name (tests/test_reasoning_parser.py)


def _message_delta(stream: ToolCallStream, split: Split) -> DeltaMessage | None:
    """The reasoning piece as it is; the content piece through the tool-call stream."""
    delta = stream.delta(split.content or "")
    if split.reasoning is None:
        return delta
    return (delta or DeltaMessage()).with_reasoning(split.reasoning)


def _usage_chunk(job: ChatJob) -> ChatCompletionChunk:
    chunk = job.chunk([])
    chunk.usage = job.usage(sum(job.tokens_by_choice.values()))
    return chunk
