"""``octavo serve [MODEL]``: the OpenAI-compatible server; ``octavo launch render [MODEL]``:
its render endpoints alone, with no model weights (vLLM's ``vllm launch render``)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from octavo.entrypoints.openai import options
from octavo.model_executor.models.registry import supported_architectures

if TYPE_CHECKING:
    from octavo.config import EngineArgs
    from octavo.entrypoints.openai.context import ServerConfig
    from octavo.entrypoints.openai.server import ListenArgs

DESCRIPTION = (
    "Serve a model over an OpenAI-compatible HTTP API (/v1/completions, "
    "/v1/chat/completions, /v1/responses, /v1/embeddings, the /render endpoints, "
    "/v1/models, /tokenize, /detokenize, "
    "/health, /metrics, /version); with --headless, a worker host of a multi-node engine "
    "(--nnodes) instead, with no API server. MODEL is a local Hugging Face model folder (or "
    "file://PATH) or a Hugging Face Hub model hf://ORG/NAME[@REVISION] (also a bare "
    "ORG/NAME); without it the embedded SmolLM2-135M-Instruct is served. The port opens "
    "at once (/health answers 503 until the model is loaded). SIGTERM drains: new "
    "requests get 503, in-flight ones finish (up to --shutdown-timeout), then the process "
    "exits 0."
)


RENDER_DESCRIPTION = (
    "Serve only what rendering needs, with no accelerator and no model weights: "
    "/v1/completions/render and /v1/chat/completions/render (the token ids the model server "
    "would run for a request, for an endpoint picker's token producer), /v1/models, "
    "/tokenize, /detokenize, /health, /metrics and /version. Only the model's config.json "
    "and tokenizer are read (a hub model's weights are not downloaded). It takes the "
    "flags of `octavo serve`: give it the served model's so that it renders the same "
    "(--served-model-name, --tokenizer, --max-model-len, --chat-template, "
    "--default-chat-template-kwargs, --tool-call-parser, --tool-prompt-fallback, "
    "--generation-config, ...); the engine's other flags are accepted and do not matter."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` and ``launch render`` subcommands."""
    parser = subparsers.add_parser(
        "serve",
        help="run the OpenAI-compatible server",
        description=DESCRIPTION,
        epilog=options.env_epilog(),
        allow_abbrev=False,
    )
    add_server_arguments(parser)
    parser.set_defaults(func=serve)
    launch = subparsers.add_parser(
        "launch", help="run one component of the server alone", allow_abbrev=False
    )
    components = launch.add_subparsers(dest="component", required=True)
    render = components.add_parser(
        "render",
        help="run the render endpoints alone (no model weights, no accelerator)",
        description=RENDER_DESCRIPTION,
        epilog=options.env_epilog(),
        allow_abbrev=False,
    )
    add_server_arguments(render)
    render.set_defaults(func=launch_render)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """MODEL and every option of ``octavo serve``."""
    parser.add_argument(
        "model",
        nargs="?",
        default=os.environ.get(options.MODEL_ENV),
        help=f"model folder, .gguf file or hf://ORG/NAME (default: the embedded SmolLM2) "
        f"[env {options.MODEL_ENV}]; architectures: {', '.join(supported_architectures())}",
    )
    options.add_options(parser, os.environ)


def serve(args: argparse.Namespace) -> int:
    """Validate everything that can be checked before the port opens, then serve."""
    from octavo.engine.early_checks import check_parallel_layout_early, check_quantization_early
    from octavo.entrypoints.openai.server import run_server
    from octavo.executor.node_channel import require_node_key
    from octavo.model_executor.model_folders import check_model_early

    engine_args = parsed_engine_args(args)
    if engine_args.kv_events_config is not None:  # an unnamed endpoint binds on --host
        engine_args.kv_events_config.server_host = args.host
    check_node_role(args.headless, engine_args)  # --headless on worker hosts only
    require_node_key(engine_args.nnodes)  # multi-node: OCTAVO_NODE_KEY on every host
    check_model_early(args.model, args.revision)  # a wrong path fails before the port opens
    check_parallel_layout_early(engine_args)  # so does a layout the model cannot take
    check_quantization_early(engine_args)  # and a quantization it does not fit
    if args.headless:
        from octavo.entrypoints.headless import run_headless

        return run_headless(engine_args)
    config = server_config(args, engine_args)
    return run_server(config, engine_args, listen_args(args))


def check_node_role(headless: bool, engine_args: EngineArgs) -> None:
    """``--headless`` with a worker host's ``--node-rank``, never without; ValueError."""
    from octavo.distributed.node_layout import node_role_problem

    problem = node_role_problem(headless, engine_args.node_rank, engine_args.nnodes)
    if problem is not None:
        raise ValueError(problem)


def launch_render(args: argparse.Namespace) -> int:
    """Validate the flags and the model reference, then serve the render endpoints."""
    from octavo.entrypoints.openai.server import run_server
    from octavo.model_executor.model_folders import check_model_early

    engine_args = parsed_engine_args(args)
    check_model_early(args.model, args.revision)
    config = server_config(args, engine_args)
    return run_server(config, engine_args, listen_args(args), render_only=True)


def parsed_engine_args(args: argparse.Namespace) -> EngineArgs:
    """The engine's arguments of parsed flags; ValueError (one clear line from ``octavo``)
    on bad values."""
    from octavo.config import EngineArgs

    options.finish(args)
    return EngineArgs(
        model=args.model,
        **{option.dest: getattr(args, option.dest) for option in options.ENGINE_OPTIONS},
    )


def server_config(args: argparse.Namespace, engine_args: EngineArgs) -> ServerConfig:
    """The HTTP-level settings of parsed ``serve`` flags; ValueError on bad combinations."""
    from octavo.entrypoints.openai.context import DEFAULT_LIMIT_CONCURRENCY, ServerConfig
    from octavo.inputs.chat import load_chat_template
    from octavo.model_executor.embedded import EMBEDDED_MODEL_NAME
    from octavo.model_executor.hub import served_name
    from octavo.model_executor.model_folders import sampling_defaults
    from octavo.tracing import require_otel

    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
    if args.otlp_traces_endpoint:
        require_otel()  # the SDK and exporters are an optional extra
    default_name = served_name(args.model) if args.model else EMBEDDED_MODEL_NAME
    return ServerConfig(
        served_model_names=args.served_model_name or [default_name],
        model_root=args.model or EMBEDDED_MODEL_NAME,
        api_key=args.api_key or None,
        max_queue_len=args.max_queue_len,
        shutdown_timeout=args.shutdown_timeout,
        max_sequences_per_request=args.max_sequences_per_request,
        limit_concurrency=args.limit_concurrency
        or max(DEFAULT_LIMIT_CONCURRENCY, 2 * engine_args.max_num_seqs),
        header_timeout=args.header_timeout,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        tool_prompt_fallback=args.tool_prompt_fallback,
        reasoning_parser=args.reasoning_parser,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
        allow_runtime_lora_updating=args.allow_runtime_lora_updating
        or os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
        lora_allowed_roots=args.lora_allowed_roots,
        chat_template=load_chat_template(args.chat_template) if args.chat_template else None,
        response_role=args.response_role,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_log_requests=args.enable_log_requests,
        otlp_traces_endpoint=args.otlp_traces_endpoint or None,
        disable_web_ui=args.disable_web_ui,
        max_logprobs=engine_args.max_logprobs,
        sampling_defaults=sampling_defaults(
            engine_args.generation_config, args.model, args.revision
        ),
    )


def listen_args(args: argparse.Namespace) -> ListenArgs:
    """Where to listen; uvicorn logs at ``--uvicorn-log-level`` (default: ``--log-level``)."""
    from octavo.entrypoints.openai.server import ListenArgs

    level = args.uvicorn_log_level or args.log_level
    return ListenArgs(host=args.host, port=args.port, log_level=level)
