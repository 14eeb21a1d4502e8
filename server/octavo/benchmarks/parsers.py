"""One way to build a benchmark's parser, as a ``bench`` subcommand or on its own."""

from __future__ import annotations

import argparse
from collections.abc import Callable

AddArguments = Callable[[argparse.ArgumentParser], None]


def register_subcommand(
    kinds: argparse._SubParsersAction,
    name: str,
    help_text: str,
    doc: str | None,
    epilog: str,
    add_arguments: AddArguments,
    run: Callable[[argparse.Namespace], int],
) -> None:
    """Add ``octavo bench NAME`` with its arguments; the parsed args carry ``func=run``."""
    parser = kinds.add_parser(
        name,
        help=help_text,
        description=doc,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def standalone_parser(
    name: str, doc: str | None, epilog: str, add_arguments: AddArguments
) -> argparse.ArgumentParser:
    """The same arguments as a parser of its own (what tests and ``main(argv)`` use)."""
    parser = argparse.ArgumentParser(
        prog=f"octavo bench {name}",
        description=doc,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_arguments(parser)
    return parser
