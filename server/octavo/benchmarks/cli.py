"""``octavo bench ...``: parsers for the benchmark subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks", allow_abbrev=False)
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    from octavo.benchmarks import offline, serve

    offline.register(kinds)
    serve.register(kinds)
