"""One way to build a benchmark's parser, as a ``bench`` subcommand or on its own."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

PROG = "python -m octavo_bench"
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
    """Add the subcommand ``NAME`` with its arguments; the parsed args carry ``func=run``."""
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
        prog=f"{PROG} {name}",
        description=doc,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_arguments(parser)
    return parser


def name_list(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated subset of ``allowed`` (empty string = none)."""

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown)}; choose from {', '.join(allowed)}"
            )
        return list(dict.fromkeys(names))

    return parse


def add_engines_option(parser: argparse.ArgumentParser, engines: tuple[str, ...]) -> None:
    """``--engines``: the subset of ``engines`` a benchmark runs (default: all)."""
    parser.add_argument(
        "--engines",
        type=name_list(engines),
        default=list(engines),
        help=f"comma-separated subset of {','.join(engines)} (default: all)",
    )


def add_output_dir(parser: argparse.ArgumentParser, stem: str) -> None:
    """``--output-dir``: where the benchmark's ``stem``.json and ``stem``.png go."""
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("bench-results"),
        help=f"where {stem}.json and {stem}.png go (default: %(default)s)",
    )


def int_list(text: str) -> list[int]:
    """An argparse type: ``1,5,10,20`` (positive, de-duplicated, in the given order)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,5,10, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers, got {text!r}")
    return list(dict.fromkeys(values))
