"""POST /v1/completions: one engine request per prompt (admitted together), streamed or
collected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.context import ServerContext
from octavo.entrypoints.openai.disconnect import cancel_on_disconnect
from octavo.entrypoints.openai.logprobs_format import (
    TokenDecoder,
    all_logprobs,
    completion_logprobs,
    new_logprobs,
    prompt_scoring_logprobs,
)
from octavo.entrypoints.openai.middleware import request_ids
from octavo.entrypoints.openai.prompts import (
    Prompt,
    completion_prompts,
    prompt_items,
    prompt_text,
)
from octavo.entrypoints.openai.protocol import CompletionRequest
from octavo.entrypoints.openai.request_params import (
    resolve_max_tokens,
    to_sampling_params,
    with_transfer_params,
)
from octavo.entrypoints.openai.responses import CompletionChoice, CompletionResponse, Usage
from octavo.entrypoints.openai.streaming import (
    close_streams,
    merge_streams,
    open_streams,
    sse_event,
    sse_frames,
    sse_response,
)
from octavo.entrypoints.openai.structured_outputs import checked_constraint, chosen_constraint
from octavo.lora_request import LoRARequest
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling_params import SamplingParams
from octavo.structured_output.params import StructuredOutputsParams

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


@dataclass
class _ChoiceState:
    """What has been streamed so far for one choice."""

    started: bool = False
    finished: bool = False
    num_tokens: int = 0
    text_offset: int = 0


@dataclass
class CompletionJob:
    body: CompletionRequest
    response_id: str
    model_name: str
    prompts: list[Prompt]
    decoder: TokenDecoder
    tokenizer: object
    report_cached: bool = False  # --enable-prompt-tokens-details
    cached_by_prompt: dict[int, int] = field(default_factory=dict)
    choices: dict[int, _ChoiceState] = field(default_factory=dict)

    def header(self, choices: list[CompletionChoice]) -> CompletionResponse:
        return CompletionResponse(id=self.response_id, model=self.model_name, choices=choices)

    def echo_text(self, prompt_index: int) -> str:
        return prompt_text(self.prompts[prompt_index], self.tokenizer) if self.body.echo else ""

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(prompt.token_ids) for prompt in self.prompts)

    def usage(self, completion_tokens: int) -> Usage:
        cached = sum(self.cached_by_prompt.values()) if self.report_cached else None
        return Usage.of(self.num_prompt_tokens, completion_tokens, cached)


@dataclass
class CompletionInputs:
    """What the engine is given for a request: one prompt and its parameters per prompt."""

    adapter: LoRARequest | None
    info: EngineInfo
    prompts: list[Prompt]
    params: list[SamplingParams]


async def completion_inputs(
    body: CompletionRequest, context: ServerContext, admitting: bool = True
) -> CompletionInputs:
    """The request checked and turned into engine inputs (the render endpoint's answer).

    The per-request limits (prompts × n, each prompt's length) hold for a render too, and
    are checked before anything is tokenized. ``admitting``: the request is about to run,
    so its constraint is compiled too.
    """
    adapter = context.check_model(body.model)
    info = context.ready_info()
    context.check_logprobs(body.logprobs, "logprobs")
    items = prompt_items(body.prompt)
    context.check_fan_out(len(items) * body.n, info, "prompt")
    prompts = await context.tokenizers.run(completion_prompts, items, info)
    if admitting:
        constraint = await checked_constraint(body, info, context)
    else:
        constraint = chosen_constraint(body)
    params = [_params(body, prompt, info.max_model_len, constraint, context) for prompt in prompts]
    return CompletionInputs(adapter, info, prompts, params)


async def create_completion(
    body: CompletionRequest, raw_request: Request, context: ServerContext
) -> Response:
    inputs = await completion_inputs(body, context)
    ids = request_ids(raw_request.scope, "cmpl", body.request_id)
    job = CompletionJob(
        body=body,
        response_id=ids.response,
        model_name=context.response_model(body.model),
        prompts=inputs.prompts,
        decoder=context.decoder(),
        tokenizer=inputs.info.tokenizer,
        report_cached=context.config.enable_prompt_tokens_details,
    )
    streams = await open_streams(
        context.engine,
        ids.engine,
        [p.token_ids for p in inputs.prompts],
        inputs.params,
        inputs.adapter,
        context.config.enable_log_requests,
    )
    if body.stream:
        return sse_response(_stream(job, streams))
    try:
        finals = await cancel_on_disconnect(
            raw_request, asyncio.gather(*(stream.final() for stream in streams))
        )
    finally:
        close_streams(streams)
    return JSONResponse(with_transfer_params(_full_response(job, finals).model_dump(), finals))


def _params(
    body: CompletionRequest,
    prompt: Prompt,
    max_model_len: int,
    constraint: StructuredOutputsParams | None,
    context: ServerContext,
) -> SamplingParams:
    defaults = context.config.sampling_defaults
    default_max = defaults.get("max_tokens", DEFAULT_MAX_TOKENS)
    max_tokens = resolve_max_tokens(
        body.requested_max_tokens, len(prompt.token_ids), max_model_len, default_max, "prompt"
    )
    scored = body.logprobs if body.echo else None  # echo + logprobs scores the prompt
    return to_sampling_params(body, max_tokens, body.logprobs, constraint, scored, defaults)


# ----- non-streaming -------------------------------------------------------------------
def _full_response(job: CompletionJob, finals: list[RequestOutput]) -> CompletionResponse:
    choices = [
        _full_choice(job, prompt_index, output, final.prompt_logprobs)
        for prompt_index, final in enumerate(finals)
        for output in final.outputs
    ]
    generated = sum(len(output.token_ids) for final in finals for output in final.outputs)
    response = job.header(sorted(choices, key=lambda choice: choice.index))
    job.cached_by_prompt = {i: final.num_cached_tokens for i, final in enumerate(finals)}
    response.usage = job.usage(generated)
    return response


def _full_choice(
    job: CompletionJob, prompt_index: int, output: CompletionOutput, prompt_logprobs=None
) -> CompletionChoice:
    echo = job.echo_text(prompt_index)
    logprobs = None
    if job.body.logprobs is not None:
        logprobs, _ = completion_logprobs(
            all_logprobs(output), job.decoder, job.body.logprobs, len(echo)
        )
        if echo and prompt_logprobs is not None:  # lm-eval's local-completions scoring
            prompt_ids = job.prompts[prompt_index].token_ids
            scored = prompt_scoring_logprobs(
                prompt_ids, prompt_logprobs, job.decoder, job.body.logprobs
            )
            logprobs = scored.followed_by(logprobs)
    return CompletionChoice(
        index=prompt_index * job.body.n + output.index,
        text=echo + output.text,
        logprobs=logprobs,
        finish_reason=output.finish_reason,
        stop_reason=output.stop_reason,
    )


# ----- streaming -----------------------------------------------------------------------
def _stream(job: CompletionJob, streams: list) -> AsyncIterator[str]:
    usage = (lambda: sse_event(_usage_chunk(job))) if job.body.include_usage else None
    return sse_frames(_chunks(job, streams), usage, lambda: close_streams(streams))


async def _chunks(job: CompletionJob, streams: list) -> AsyncIterator[str]:
    exclude = None if job.body.include_usage else {"usage"}
    async for prompt_index, output in merge_streams(streams):
        job.cached_by_prompt[prompt_index] = output.num_cached_tokens
        for completion in output.outputs:
            choice = _delta_choice(job, prompt_index, completion)
            if choice is not None:
                yield sse_event(job.header([choice]), exclude=exclude)


def _delta_choice(
    job: CompletionJob, prompt_index: int, output: CompletionOutput
) -> CompletionChoice | None:
    index = prompt_index * job.body.n + output.index
    state = job.choices.setdefault(index, _ChoiceState())
    if state.finished:
        return None
    text = output.delta_text
    if not state.started:
        state.started = True
        echo = job.echo_text(prompt_index)
        text, state.text_offset = echo + text, len(echo)
    state.num_tokens = len(output.token_ids)
    state.finished = output.finished
    if not (text or output.finished or (job.body.logprobs is not None and output.delta_token_ids)):
        return None
    logprobs = None
    if job.body.logprobs is not None:
        logprobs, state.text_offset = completion_logprobs(
            new_logprobs(output), job.decoder, job.body.logprobs, state.text_offset
        )
    return CompletionChoice(
        index=index,
        text=text,
        logprobs=logprobs,
        finish_reason=output.finish_reason,
        stop_reason=output.stop_reason,
    )


def _usage_chunk(job: CompletionJob) -> CompletionResponse:
    response = job.header([])
    generated = sum(state.num_tokens for state in job.choices.values())
    response.usage = job.usage(generated)
    return response
