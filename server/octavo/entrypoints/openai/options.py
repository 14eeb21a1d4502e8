"""The ``octavo serve`` options: vLLM's flag names, each also read from ``OCTAVO_<NAME>``.

An environment variable becomes the option's default, so a flag on the command line
wins over it. argparse converts (and checks) string defaults with the option's type,
so a bad environment value is reported like a bad flag.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from octavo.arg_types import (
    non_negative_float,
    one_of,
    parse_bool,
    port_number,
    positive_float,
    positive_int,
)
from octavo.config import flag_fields
from octavo.entrypoints.openai.reasoning.parsers import REASONING_PARSER_NAMES
from octavo.entrypoints.openai.template_kwargs import template_kwargs_arg
from octavo.entrypoints.openai.tool_calls.parsers import TOOL_CALL_PARSER_NAMES
from octavo.logging_format import LOG_FORMATS

ENV_PREFIX = "OCTAVO_"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
UVICORN_LOG_LEVELS = (*LOG_LEVELS, "trace")


@dataclass(frozen=True)
class Option:
    """One flag of ``octavo serve``; ``kind`` is ``value``, ``bool`` or ``list``."""

    flag: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    kind: str = "value"
    secret: bool = False
    negation: str | None = None  # another flag that sets a bool option false (vLLM's)
    aliases: tuple[str, ...] = ()  # short spellings of the flag (vLLM's -O)

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def engine_options() -> tuple[Option, ...]:
    """The engine's flags, derived from ``EngineArgs`` (their one declaration)."""
    return tuple(
        Option(
            flag="--" + field.name.replace("_", "-"),
            help=spec.help,
            type=spec.parse,
            default=field.default,
            choices=spec.choices,
            kind=spec.kind,
            aliases=spec.aliases,
        )
        for field, spec in flag_fields()
    )


ENGINE_OPTIONS = engine_options()
SERVER_OPTIONS: tuple[Option, ...] = (
    Option("--host", "address to listen on", default="0.0.0.0"),
    Option("--port", "TCP port to listen on", port_number, 8000),
    Option(
        "--served-model-name",
        "name(s) clients use in the 'model' field; the first is reported in responses "
        "(default: the model argument, or the embedded model's name)",
        kind="list",
    ),
    Option(
        "--api-key",
        "require 'Authorization: Bearer KEY' on every route except /health, /metrics and /version",
        secret=True,
    ),
    Option(
        "--max-queue-len",
        "most waiting requests before answering 429 (default: unlimited)",
        positive_int,
    ),
    Option(
        "--max-sequences-per-request",
        "most sequences (prompts × n) one request may ask for, else 400 (default: as many "
        "sequences of --max-model-len tokens as the KV cache holds, at least --max-num-seqs)",
        positive_int,
    ),
    Option(
        "--limit-concurrency",
        "most requests in flight before answering 503; /health, /metrics and /version "
        "always pass, and connections are capped 64 above it (default: 2 × --max-num-seqs, "
        "at least 512)",
        positive_int,
    ),
    Option(
        "--header-timeout",
        "seconds a connection may take to send a request's headers before it is closed",
        positive_float,
        10.0,
    ),
    Option(
        "--shutdown-timeout",
        "seconds to finish in-flight requests after SIGTERM",
        non_negative_float,
        30.0,
    ),
    Option(
        "--enable-auto-tool-choice",
        "let the model decide when to call tools (tool_choice 'auto', the default when "
        "tools are given); needs --tool-call-parser",
        parse_bool,
        False,
        kind="bool",
    ),
    Option(
        "--tool-call-parser",
        "how tool calls are read from the model's text with tool_choice 'auto', vLLM's "
        "names: hermes (Hermes/Qwen <tool_call> blocks), llama3_json (Llama 3.1+ JSON), "
        "mistral ([TOOL_CALLS]), pythonic (Llama 3.2/4 [f(a=1)]), deepseek_v3, "
        "qwen3_coder (Qwen3-Coder/Qwen3-Next XML), glm45 (GLM-4.5/4.6), kimi_k2, "
        "openai (gpt-oss Harmony: commentary messages to=functions.NAME)",
        one_of(TOOL_CALL_PARSER_NAMES),
        None,
        TOOL_CALL_PARSER_NAMES,
    ),
    Option(
        "--tool-prompt-fallback",
        "when the chat template never uses 'tools', show the tools to the model as text in "
        "the system message, and earlier tool calls and results as plain turns, so tool "
        "requests work on every model (tool_choice 'required' and named calls at once; "
        "'auto' still needs --enable-auto-tool-choice); --no-tool-prompt-fallback refuses "
        "such requests with a 400",
        parse_bool,
        True,
        kind="bool",
    ),
    Option(
        "--reasoning-parser",
        "put a reasoning model's thinking (its <think> block) in the chat replies' "
        "reasoning_content, streamed or not: deepseek_r1 (DeepSeek-R1, QwQ), qwen3 "
        "(Qwen3; honours chat_template_kwargs enable_thinking), glm45 (GLM-4.5/4.6), "
        "granite (Granite 3.2+ 'Here is my thought process:'), minimax_m2 (MiniMax-M2) "
        "or openai_gptoss (gpt-oss Harmony: the analysis channel)",
        one_of(REASONING_PARSER_NAMES),
        None,
        REASONING_PARSER_NAMES,
    ),
    Option(
        "--default-chat-template-kwargs",
        "a JSON object passed to the chat template on every chat request, e.g. "
        "'{\"enable_thinking\": false}'; a request's chat_template_kwargs win over it",
        template_kwargs_arg,
    ),
    Option(
        "--allow-runtime-lora-updating",
        "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (off by default, as "
        "in vLLM; VLLM_ALLOW_RUNTIME_LORA_UPDATING=true also turns it on)",
        parse_bool,
        False,
        kind="bool",
    ),
    Option(
        "--lora-allowed-roots",
        "folders under which run-time adapter loads may read (default: none but the "
        "folders of --lora-modules)",
        kind="list",
    ),
    Option(
        "--chat-template",
        "the chat template: a Jinja file, or the template text itself (default: the tokenizer's)",
    ),
    Option(
        "--response-role",
        "the role of the chat responses' messages (when add_generation_prompt is true; "
        "else the last message's role, as in vLLM)",
        default="assistant",
    ),
    Option(
        "--return-tokens-as-token-ids",
        "logprobs name tokens as 'token_id:N' (text that cannot stand alone stays exact)",
        parse_bool,
        False,
        kind="bool",
    ),
    Option(
        "--enable-prompt-tokens-details",
        "usage.prompt_tokens_details.cached_tokens: the prompt tokens found in the prefix cache",
        parse_bool,
        False,
        kind="bool",
    ),
    Option(
        "--enable-log-requests",
        "log a line per request (its id, sampling parameters, prompt token ids and "
        "adapter); off by default, as in recent vLLM (--disable-log-requests: off)",
        parse_bool,
        False,
        kind="bool",
        negation="--disable-log-requests",
    ),
    Option(
        "--disable-web-ui",
        "do not serve the built-in web page at / (a chat playground and a live view of "
        "the server's metrics; with --api-key it asks for the key)",
        parse_bool,
        False,
        kind="bool",
    ),
    Option(
        "--headless",
        "run a worker host of a multi-node engine (with --nnodes and its --node-rank > 0): "
        "no API server, only this host's worker processes, driven by the leader at "
        "--master-addr:--master-port; exits 0 when the leader stops, 2 when the leader or "
        "a worker here is lost, 1 when it cannot join",
        parse_bool,
        False,
        kind="bool",
    ),
    Option("--log-level", "log level", one_of(LOG_LEVELS), "info", LOG_LEVELS),
    Option(
        "--log-format",
        "text (human-readable lines) or json (one JSON object per line for log pipelines: "
        "time, level, logger, message, and a request's id, adapter, tokens and timings); "
        "the engine core and workers log the same way",
        one_of(LOG_FORMATS),
        "text",
        LOG_FORMATS,
    ),
    Option(
        "--otlp-traces-endpoint",
        "send a span per request (vLLM's 'llm_request' with gen_ai.* attributes: ids, "
        "sampling fields, token counts, queue/prefill/decode/TTFT/e2e latencies) to this "
        "OpenTelemetry collector over OTLP, continuing the caller's W3C traceparent; gRPC "
        "(e.g. http://collector:4317) unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is "
        "http/protobuf (then the full URL, e.g. http://collector:4318/v1/traces); needs "
        "pip install 'octavo[otel]'",
    ),
    Option(
        "--uvicorn-log-level",
        "uvicorn's own log level (its access log lines are at info; default: --log-level)",
        one_of(UVICORN_LOG_LEVELS),
        None,
        UVICORN_LOG_LEVELS,
    ),
)
OPTIONS = ENGINE_OPTIONS + SERVER_OPTIONS
MODEL_ENV = ENV_PREFIX + "MODEL"


def add_options(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Add every option, its default taken from the environment when set there."""
    for option in OPTIONS:
        default = environ.get(option.env, option.default)
        if option.kind == "list" and isinstance(default, str):
            default = _split_list(default)  # argparse would convert the whole text as one
        shown = "(set)" if option.secret and default else default
        help_text = option.help if shown is None else f"{option.help} (default: {shown})"
        help_text += f" [env {option.env}]"
        if option.kind == "bool":
            _add_bool(parser, option, _env_bool(default), help_text)
            continue
        parser.add_argument(
            option.flag,
            *option.aliases,
            type=option.type,
            default=default,
            choices=option.choices,
            nargs="+" if option.kind == "list" else None,
            help=help_text,
            metavar=option.dest.upper() if option.choices is None else None,
        )


def _add_bool(
    parser: argparse.ArgumentParser, option: Option, default: Any, help_text: str
) -> None:
    """``--x`` / ``--no-x``, and the option's vLLM negation flag if it has one."""
    parser.add_argument(
        option.flag, action=argparse.BooleanOptionalAction, default=default, help=help_text
    )
    if option.negation is not None:
        parser.add_argument(
            option.negation,
            dest=option.dest,
            action="store_false",
            help=f"the same as --no-{option.flag.removeprefix('--')}",
        )


def _split_list(text: str) -> list[str]:
    return [item for item in re.split(r"[,\s]+", text) if item]


def _env_bool(value: Any) -> Any:
    """Environment booleans are converted here; a bad one is reported by ``finish``."""
    if isinstance(value, str):
        try:
            return parse_bool(value)
        except ValueError:
            return value
    return value


def finish(args: argparse.Namespace) -> None:
    """Checks argparse cannot do for environment defaults; raises ``ValueError``."""
    for option in OPTIONS:
        value = getattr(args, option.dest)
        if option.kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"{option.env} must be true or false, got {value!r}")
        if option.kind == "list" and value is not None:  # from the environment: text
            items = _split_list(value) if isinstance(value, str) else value
            setattr(args, option.dest, [option.type(v) if isinstance(v, str) else v for v in items])


def env_epilog() -> str:
    """The --help epilog: how the environment maps onto flags."""
    names = ", ".join(option.env for option in OPTIONS)
    return (
        f"Every option can also be set from the environment: {MODEL_ENV} for MODEL and "
        f"OCTAVO_<FLAG> for --<flag> (upper case, '-' -> '_'): {names}. Booleans accept "
        "1/0, true/false, yes/no, on/off; OCTAVO_SERVED_MODEL_NAME takes a comma-separated "
        "list, and OCTAVO_LORA_MODULES a comma- or space-separated list of NAME=PATH. "
        "A flag given on the command line wins over its environment variable. "
        "OCTAVO_CACHE sets where the embedded model is cached (OCTAVO_BAKED_MODELS names "
        "read-only folders searched first) and, unless HF_HUB_CACHE is set, where hub "
        "models are downloaded ($OCTAVO_CACHE/hf); HF_HUB_OFFLINE=1 loads hub models from "
        "that cache only. The API key guards every route "
        "except /health, /metrics and /version, which stay open for probes and scrapes."
    )
