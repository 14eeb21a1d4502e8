"""``octavo chat`` and ``octavo complete``: talk to a running server from a terminal, with
vLLM's flags (``vllm chat`` / ``vllm complete``): ``--url`` (the API base, default
``http://localhost:8000/v1``), ``--model-name`` (default: the server's first model),
``--api-key`` (default ``$OPENAI_API_KEY``), ``-q/--quick`` for one message and exit.

Without ``--quick`` each line read from standard input is one message (chat keeps the
conversation, with ``--system-prompt`` first); an empty line or end of input ends it.
Replies stream to standard output as they are generated. A server that cannot be reached
or that refuses a request is one line on standard error and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

import httpx

DEFAULT_URL = "http://localhost:8000/v1"
TIMEOUT = httpx.Timeout(600.0, connect=10.0)


class ClientError(Exception):
    """What went wrong talking to the server, said in one line."""


@dataclass
class ServerClient:
    url: str
    api_key: str | None = None
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.http = httpx.Client(headers=headers, timeout=TIMEOUT)

    def first_model(self) -> str:
        models = self._checked(lambda: self.http.get(f"{self.url}/models")).json()["data"]
        if not models:
            raise ClientError(f"{self.url}/models lists no model")
        return models[0]["id"]

    def stream(self, route: str, body: dict) -> Iterator[dict]:
        """The chunks of a streamed request (``data:`` lines of the SSE stream)."""
        try:
            with self.http.stream("POST", f"{self.url}/{route}", json=body) as response:
                if response.status_code >= 400:
                    raise ClientError(_refusal(response.status_code, response.read()))
                for line in response.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        yield json.loads(line.removeprefix("data: "))
        except httpx.TransportError as error:
            raise ClientError(_unreachable(self.url, error)) from None

    def _checked(self, call) -> httpx.Response:
        try:
            response = call()
        except httpx.TransportError as error:
            raise ClientError(_unreachable(self.url, error)) from None
        if response.status_code >= 400:
            raise ClientError(_refusal(response.status_code, response.content))
        return response


def _unreachable(url: str, error: Exception) -> str:
    return f"cannot reach {url} ({type(error).__name__}: {error}); is `octavo serve` running there?"


def _refusal(status: int, content: bytes) -> str:
    try:
        message = json.loads(content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = content.decode(errors="replace")[:300]
    return f"the server answered {status}: {message}"


def chat_reply(
    client: ServerClient, model: str, messages: list[dict], out: TextIO, max_tokens: int | None
) -> str:
    """Stream one assistant reply to ``out``; returns its whole text."""
    body = {"model": model, "messages": messages, "stream": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    parts = []
    for chunk in client.stream("chat/completions", body):
        for choice in chunk.get("choices", []):
            text = (choice.get("delta") or {}).get("content") or ""
            parts.append(text)
            out.write(text)
            out.flush()
    out.write("\n")
    return "".join(parts)


def completion(
    client: ServerClient, model: str, prompt: str, max_tokens: int | None, out: TextIO
) -> str:
    """Stream one completion of ``prompt`` to ``out``; returns its whole text."""
    body = {"model": model, "prompt": prompt, "stream": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    parts = []
    for chunk in client.stream("completions", body):
        for choice in chunk.get("choices", []):
            parts.append(choice.get("text") or "")
            out.write(parts[-1])
            out.flush()
    out.write("\n")
    return "".join(parts)


def _lines(stdin: TextIO, prompt: str, stdout: TextIO) -> Iterator[str]:
    """Messages read one per line until an empty line or end of input."""
    while True:
        stdout.write(prompt)
        stdout.flush()
        line = stdin.readline()
        if not line.strip():
            return
        yield line.rstrip("\n")


def run_chat(
    args: argparse.Namespace, stdin: TextIO | None = None, out: TextIO | None = None
) -> int:
    stdin, out = stdin or sys.stdin, out or sys.stdout
    client = ServerClient(args.url, args.api_key)
    model = args.model_name or client.first_model()
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    inputs = [args.quick] if args.quick is not None else _lines(stdin, "> ", out)
    for text in inputs:
        messages.append({"role": "user", "content": text})
        reply = chat_reply(client, model, messages, out, args.max_tokens)
        messages.append({"role": "assistant", "content": reply})
    return 0


def run_complete(
    args: argparse.Namespace, stdin: TextIO | None = None, out: TextIO | None = None
) -> int:
    stdin, out = stdin or sys.stdin, out or sys.stdout
    client = ServerClient(args.url, args.api_key)
    model = args.model_name or client.first_model()
    inputs = [args.quick] if args.quick is not None else _lines(stdin, "> ", out)
    for prompt in inputs:
        completion(client, model, prompt, args.max_tokens, out)
    return 0


def _guarded(run):
    def func(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except ClientError as error:
            print(f"octavo {args.command}: error: {error}", file=sys.stderr)
            return 1

    return func


def _query_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL, help="the server's API base URL")
    parser.add_argument("--model-name", default=None, help="default: the server's first model")
    parser.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY"
    )


def build_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` (``chat ...`` or ``complete ...``) parsed as the ``octavo`` command does."""
    from octavo.cli import build_parser

    return build_parser().parse_args(argv)


def register(subparsers: argparse._SubParsersAction) -> None:
    chat = subparsers.add_parser("chat", help="chat with a running server", description=__doc__)
    _query_options(chat)
    chat.add_argument("--system-prompt", default=None)
    chat.add_argument("--max-tokens", type=int, default=None, help="per reply")
    chat.add_argument(
        "-q", "--quick", metavar="MESSAGE", default=None, help="one message, then exit"
    )
    chat.set_defaults(func=_guarded(run_chat))
    complete = subparsers.add_parser(
        "complete", help="complete prompts on a running server", description=__doc__
    )
    _query_options(complete)
    complete.add_argument("--max-tokens", type=int, default=None)
    complete.add_argument(
        "-q", "--quick", metavar="PROMPT", default=None, help="one prompt, then exit"
    )
    complete.set_defaults(func=_guarded(run_complete))
