"""The naive baseline of ``serve --baseline hf``: plain HF transformers behind HTTP.

A minimal OpenAI-style server (``/health``, ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``, streaming or not) that runs a greedy decoding loop with
transformers' own KV cache, ONE request at a time: an ``asyncio.Lock`` serializes the
requests, so concurrent users simply queue. This is what "put ``model.generate`` behind
FastAPI" gives you, and what continuous batching is measured against.

Run it alone with ``python -m octavo_bench.serve_hf_server MODEL_FOLDER --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from octavo_bench.baselines import load_hf

HF_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULT_MAX_TOKENS = 256


@dataclass
class HFModel:
    """The model, its tokenizer and the lock that lets one request run at a time.

    Decoding runs on one dedicated thread (like an engine thread), so torch always
    computes from the same thread and its OpenMP workers stay warm.
    """

    name: str
    model: Any
    tokenizer: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="hf-decode")
    )


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    chat: bool


class BadRequest(ValueError):
    pass


class GreedyDecoder:
    """One sequence's greedy decoding with transformers' KV cache: one token per ``step``."""

    def __init__(self, model: Any, prompt_ids: list[int]) -> None:
        self.model = model
        self.cache: Any = None
        self.device = model.device
        self.next_input = torch.tensor([prompt_ids], device=self.device)

    def step(self) -> int:
        with torch.inference_mode():
            out = self.model(
                input_ids=self.next_input,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        self.cache = out.past_key_values
        token = int(out.logits[0, -1].argmax())
        self.next_input = torch.tensor([[token]], device=self.device)
        return token


class TextDelta:
    """Incremental detokenization: the new text after each token (held back mid-character)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta, self.sent = text[self.sent :], len(text)
        return delta


def load_model(folder: Path, dtype: str, name: str | None = None, device: str = "cpu") -> HFModel:
    """The folder's checkpoint on ``device``, or random weights where it has only a config."""
    from transformers import AutoTokenizer

    model = load_hf(folder, HF_DTYPES[dtype], device)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return HFModel(name or Path(folder).name, model, tokenizer)


def prompt_ids(hf: HFModel, body: dict[str, Any], chat: bool) -> list[int]:
    tokenizer = hf.tokenizer
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("'prompt' must be a non-empty string")
    return tokenizer.encode(prompt)


def parse_request(hf: HFModel, body: dict[str, Any], chat: bool) -> GenerationRequest:
    """Only the fields this server honours; sampling fields are ignored (always greedy)."""
    model = body.get("model")
    if model is not None and model != hf.name:
        raise LookupError(f"The model '{model}' does not exist; this server has '{hf.name}'")
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    options = body.get("stream_options") or {}
    return GenerationRequest(
        prompt_ids=prompt_ids(hf, body, chat),
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stream=bool(body.get("stream", False)),
        include_usage=bool(options.get("include_usage", False)),
        chat=chat,
    )


def decode_loop(
    hf: HFModel, request: GenerationRequest, emit: Callable[[int | None], None], stop: Event
) -> None:
    """On the decode thread: greedy tokens to ``emit`` until done, then ``None``."""
    try:
        decoder = GreedyDecoder(hf.model, request.prompt_ids)
        for _ in range(request.max_tokens):
            if stop.is_set():
                return
            token = decoder.step()
            emit(token)
            if token == hf.tokenizer.eos_token_id and not request.ignore_eos:
                return
    finally:
        emit(None)


async def generate(hf: HFModel, request: GenerationRequest) -> AsyncIterator[tuple[str, bool]]:
    """Yield ``(new text, finished by EOS)`` per token, holding the lock throughout."""
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[int | None] = asyncio.Queue()
    stop = Event()

    def emit(token: int | None) -> None:
        loop.call_soon_threadsafe(tokens.put_nowait, token)

    async with hf.lock:
        done = loop.run_in_executor(hf.worker, decode_loop, hf, request, emit, stop)
        try:
            text = TextDelta(hf.tokenizer)
            while (token := await tokens.get()) is not None:
                eos = token == hf.tokenizer.eos_token_id and not request.ignore_eos
                yield ("" if eos else text.add(token)), eos
            await done  # re-raises an error of the decode thread
        finally:
            stop.set()  # the client left early: the decode thread stops at its next token


@dataclass
class Reply:
    """Builds the response bodies of one request in OpenAI's shapes."""

    hf: HFModel
    request: GenerationRequest
    id: str = field(default_factory=lambda: f"hf-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    tokens: int = 0

    def choice(self, text: str | None, finish: str | None, stream: bool) -> dict[str, Any]:
        if not self.request.chat:
            return {"index": 0, "text": text or "", "finish_reason": finish}
        key = "delta" if stream else "message"
        message = {"content": text} if stream else {"role": "assistant", "content": text}
        return {"index": 0, key: message, "finish_reason": finish}

    def body(self, choices: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.request.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind + (".chunk" if stream and self.request.chat else ""),
            "created": self.created,
            "model": self.hf.name,
            "choices": choices,
        }

    def usage(self) -> dict[str, int]:
        prompt = len(self.request.prompt_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.tokens,
            "total_tokens": prompt + self.tokens,
        }


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def stream_events(reply: Reply) -> AsyncIterator[str]:
    finish = "length"
    if reply.request.chat:
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        yield sse(reply.body([role], stream=True))
    async for text, stopped in generate(reply.hf, reply.request):
        reply.tokens += 1
        if stopped:
            finish = "stop"
        elif text:
            yield sse(reply.body([reply.choice(text, None, stream=True)], stream=True))
    yield sse(reply.body([reply.choice(None, finish, stream=True)], stream=True))
    if reply.request.include_usage:
        yield sse({**reply.body([], stream=True), "usage": reply.usage()})
    yield "data: [DONE]\n\n"


async def full_response(reply: Reply) -> dict[str, Any]:
    parts, finish = [], "length"
    async for text, stopped in generate(reply.hf, reply.request):
        reply.tokens += 1
        finish = "stop" if stopped else finish
        parts.append(text)
    body = reply.body([reply.choice("".join(parts), finish, stream=False)], stream=False)
    return {**body, "usage": reply.usage()}


def error_response(status: int, message: str) -> JSONResponse:
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


async def complete(hf: HFModel, raw: Request, chat: bool) -> Response:
    try:
        body = await raw.json()
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        request = parse_request(hf, body, chat)
    except LookupError as error:
        return error_response(404, str(error.args[0]))
    except ValueError as error:  # BadRequest, or a body that is not JSON
        return error_response(400, str(error))
    reply = Reply(hf, request)
    if request.stream:
        return StreamingResponse(stream_events(reply), media_type="text/event-stream")
    return JSONResponse(await full_response(reply))


def build_hf_app(hf: HFModel) -> FastAPI:
    """The FastAPI app around an already loaded model."""
    app = FastAPI(title="naive HF transformers server")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": hf.name, "object": "model", "created": 0, "owned_by": "hf-naive"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await complete(hf, raw, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await complete(hf, raw, chat=True)

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m octavo_bench.serve_hf_server", allow_abbrev=False
    )
    parser.add_argument("model", type=Path, help="local HF model folder")
    parser.add_argument("--dtype", choices=tuple(HF_DTYPES), default="float32")
    parser.add_argument("--served-model-name", default=None, help="default: the folder name")
    parser.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    import uvicorn

    hf = load_model(args.model, args.dtype, args.served_model_name, args.device)
    uvicorn.run(build_hf_app(hf), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
