"""``python -m octavo_bench offline|serve``: the benchmarks' own command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from octavo_bench import cli


@pytest.mark.parametrize("argv", [["offline", "--work", "a"], ["serve", "--base", "http://x"]])
def test_bench_subcommands_refuse_abbreviations(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err


def test_python_dash_m_runs_the_benchmarks_cli():
    command = [sys.executable, "-m", "octavo_bench", "serve", "--help"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m octavo_bench serve")
    assert "--concurrency-sweep" in result.stdout
