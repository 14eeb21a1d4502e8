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


# The engine options each benchmark that builds engines takes, spelled as `octavo serve`.
ENGINE_OPTIONS_BY_BENCH = {
    "offline": (
        "dtype",
        "max_model_len",
        "kv_cache_memory",
        "max_num_seqs",
        "max_num_batched_tokens",
        "num_threads",
        "quantization",
    ),
    "lora": ("dtype", "num_threads", "kv_cache_memory"),
    "quantized": ("dtype", "num_threads", "kv_cache_memory"),
    "speculative": ("dtype", "num_threads"),
    "parallel": ("dtype",),
    "structured": ("dtype",),
}


def bench_actions(name: str) -> dict[str, object]:
    parser = cli.build_parser()
    kinds = next(a for a in parser._actions if a.dest == "bench_command")
    return {action.dest: action for action in kinds.choices[name]._actions}


@pytest.mark.parametrize("bench", sorted(ENGINE_OPTIONS_BY_BENCH))
def test_benchmarks_take_the_engines_option_spelling(bench):
    """Flag, value parser and choices come from EngineArgs (the one declaration)."""
    from octavo.entrypoints.openai.options import ENGINE_OPTIONS

    engine = {option.dest: option for option in ENGINE_OPTIONS}
    actions = bench_actions(bench)
    for name in ENGINE_OPTIONS_BY_BENCH[bench]:
        action, option = actions[name], engine[name]
        assert action.option_strings == [option.flag]
        assert action.choices == option.choices
        assert option.help in action.help
    assert "threads" not in actions  # the old hand-written --threads is gone


def test_bench_options_parse_units_and_auto_like_the_engine():
    from octavo_bench.engine_options import default_dtype

    argv = ["lora", "--num-threads", "3", "--kv-cache-memory", "64MiB", "--dtype", "auto"]
    args = cli.build_parser().parse_args(argv)
    assert (args.num_threads, args.kv_cache_memory) == (3, 64 * 2**20)
    assert args.dtype == default_dtype()  # auto: the dtype the engine picks on this CPU
    args = cli.build_parser().parse_args(["offline", "--kv-cache-memory", "1G"])
    assert args.kv_cache_memory == 10**9 and args.num_threads is None


@pytest.mark.parametrize(
    "argv",
    [
        ["quantized", "--threads", "2"],
        ["lora", "--kv-cache-memory", "lots"],
        ["offline", "--dtype", "float64"],
    ],
)
def test_bench_refuses_what_the_engine_refuses(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
