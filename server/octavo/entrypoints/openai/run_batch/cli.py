"""``octavo run-batch -i IN.jsonl -o OUT.jsonl [serve flags] [MODEL]``: an OpenAI Batch
file through the server's own app, in this process (vLLM's ``vllm run-batch``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

from octavo.arg_types import positive_int
from octavo.entrypoints.openai import options
from octavo.entrypoints.openai.cli import add_server_arguments, parsed_engine_args, server_config
from octavo.entrypoints.openai.run_batch.output_file import check_writable

logger = logging.getLogger(__name__)

RUN_FAILED_EXIT_CODE = 1
INTERRUPTED_EXIT_CODE = 130

DESCRIPTION = (
    "Run an OpenAI Batch file (JSON lines {custom_id, method: POST, url, body}; url "
    "/v1/chat/completions, /v1/completions, /v1/embeddings or /v1/responses) through the "
    "same app as `octavo serve`, in this process, and write one result line per input line "
    "({id, custom_id, response: {status_code, request_id, body}, error}), in the order they "
    "finish. A malformed line (not JSON, no custom_id, another method or url, stream: true) "
    "gets an error line; a line without custom_id is named line-N (its line number). "
    "Results are appended and fsynced as they finish; a rerun with the same -o skips the "
    "lines whose custom_id is already there. It takes every flag of `octavo serve` (--host "
    "and --port are accepted and unused). Exit 0 when every line has a result line, error "
    "lines included; 1 when the run failed (the model did not load, the engine died)."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``run-batch`` subcommand."""
    parser = subparsers.add_parser(
        "run-batch",
        help="run an OpenAI Batch file (JSON lines) through the server's app",
        description=DESCRIPTION,
        epilog=options.env_epilog(),
        allow_abbrev=False,
    )
    parser.add_argument("-i", "--input-file", required=True, help="the batch file (JSON lines)")
    parser.add_argument(
        "-o", "--output-file", required=True, help="the results file (JSON lines; resumed)"
    )
    parser.add_argument(
        "--output-tmp-dir",
        help="write the results to a file in this folder and rename it onto -o once every "
        "line is done (so -o is never partial); a rerun resumes from that file",
    )
    parser.add_argument(
        "--max-concurrency",
        type=positive_int,
        help="most lines in flight at once (default: 2 x --max-num-seqs, at most "
        "--limit-concurrency and --max-num-seqs + --max-queue-len)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar on standard error"
    )
    add_server_arguments(parser)
    parser.set_defaults(func=run_batch_command)


def run_batch_command(args: argparse.Namespace) -> int:
    """Check the flags and the files, load the model, run the batch."""
    from octavo.entrypoints.openai.run_batch.runner import RunFailed, run_batch

    settings, app = _prepared(args)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    try:
        summary = asyncio.run(run_batch(app, settings))
    except RunFailed as error:
        logger.error("run-batch failed: %s", error)
        return RUN_FAILED_EXIT_CODE
    except KeyboardInterrupt:
        logger.error("run-batch interrupted: rerun with the same -o to resume")
        return INTERRUPTED_EXIT_CODE
    logger.info(
        "run-batch: %d lines; %d results written now (%d error lines), %d already in %s",
        summary.lines,
        summary.written,
        summary.errors,
        summary.already_done,
        settings.output_path,
    )
    return 0


def _prepared(args: argparse.Namespace):
    """The batch settings and the app (its engine not started), every check done first:
    the files before the model (whose checks may read it)."""
    from octavo.engine.core_process import ProcessCore
    from octavo.engine.early_checks import check_parallel_layout_early, check_quantization_early
    from octavo.entrypoints.openai.app import build_app
    from octavo.entrypoints.openai.run_batch.runner import BatchSettings
    from octavo.model_executor.model_folders import check_model_early

    input_path, output_path, tmp_dir = batch_files(args)
    engine_args = parsed_engine_args(args)
    config = server_config(args, engine_args)
    concurrency = max_concurrency(args, config.limit_concurrency, engine_args.max_num_seqs)
    check_model_early(args.model, args.revision)
    check_parallel_layout_early(engine_args)
    check_quantization_early(engine_args)
    settings = BatchSettings(
        input_path, output_path, tmp_dir, concurrency, config.api_key, not args.no_progress
    )
    return settings, build_app(config, ProcessCore(engine_args))


def batch_files(args: argparse.Namespace) -> tuple[Path, Path, Path | None]:
    """The input, the output and the temporary folder; ValueError (one clear line) on bad
    ones."""
    for flag, value in (("-i", args.input_file), ("-o", args.output_file)):
        if value.startswith(("http://", "https://")):
            raise ValueError(f"{flag} takes a local file; http(s) URLs are not supported")
    input_path, output_path = Path(args.input_file), Path(args.output_file)
    if not input_path.is_file():
        raise ValueError(f"-i {input_path}: no such file")
    if output_path.is_dir() or not output_path.parent.is_dir():
        raise ValueError(f"-o {output_path}: not a file in an existing folder")
    if os.path.realpath(input_path) == os.path.realpath(output_path):
        raise ValueError("-o must not be the input file")
    tmp_dir = Path(args.output_tmp_dir) if args.output_tmp_dir else None
    if tmp_dir is not None and not tmp_dir.is_dir():
        raise ValueError(f"--output-tmp-dir {tmp_dir}: no such folder")
    check_writable(output_path, tmp_dir)
    return input_path, output_path, tmp_dir


def max_concurrency(args: argparse.Namespace, limit_concurrency: int, max_num_seqs: int) -> int:
    """Lines in flight at once: enough to fill the engine's batch (``max_num_seqs``, as the
    engine resolved it) twice over, within the app's own in-flight cap (beyond it the app
    would answer 503) and, with ``--max-queue-len``, within what the engine runs and
    queues (beyond it: 429s, retried)."""
    default = min(2 * max_num_seqs, limit_concurrency)
    if args.max_queue_len is not None:
        default = min(default, max_num_seqs + args.max_queue_len)
    concurrency = args.max_concurrency or default
    if concurrency > limit_concurrency:
        raise ValueError(
            f"--max-concurrency {concurrency} is above --limit-concurrency {limit_concurrency}"
        )
    return concurrency
