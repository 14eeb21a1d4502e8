"""The ``octavo`` command: one subcommand per module, each registering its own parser."""

from __future__ import annotations

import argparse
import importlib
import sys

from octavo.entrypoints.openai.cli_spellings import vllm_spellings
from octavo.logging_format import configure_logging
from octavo.model_executor.hub_reach import ModelFetchError
from octavo.stack_dumps import dump_stacks_on_signal

FETCH_FAILURE_EXIT_CODE = 1  # the model cannot be had (bad input exits 2)

# Each module exposes ``register(subparsers)``; its parser sets ``func(args) -> int``.
SUBCOMMAND_MODULES = (
    "octavo.entrypoints.openai.cli",
    "octavo.entrypoints.openai.run_batch.cli",
    "octavo.entrypoints.client_cli",
    "octavo_bench.bench_cli",
    "octavo.model_executor.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="octavo", description=__doc__, allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        argv = vllm_spellings(sys.argv[1:] if argv is None else argv)
    except ValueError as error:
        print(f"octavo: error: {error}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    dump_stacks_on_signal()
    try:
        configure_logging(
            getattr(args, "log_level", "INFO"), kind=getattr(args, "log_format", None)
        )
        return int(args.func(args) or 0)
    except ModelFetchError as error:  # what was tried, why it failed, what to do
        print(f"octavo: error: {error}", file=sys.stderr)
        return FETCH_FAILURE_EXIT_CODE
    except ValueError as error:  # bad input: one clear line, no traceback
        print(f"octavo: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
