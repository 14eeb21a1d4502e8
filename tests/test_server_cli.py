"""`octavo serve` options: flags, OCTAVO_* environment variables, help, early refusals."""

from __future__ import annotations

import argparse

import pytest

from octavo.arg_types import parse_size
from octavo.cli import build_parser, main
from octavo.entrypoints.openai import options
from octavo.model_executor.models.registry import supported_architectures

from serve_args import clean_environment, parse  # noqa: F401 (an autouse fixture)

FLAGS = (
    "--host",
    "--port",
    "--served-model-name",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--block-size",
    "--kv-cache-memory",
    "--gpu-memory-utilization",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--dtype",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--api-key",
    "--max-queue-len",
    "--shutdown-timeout",
    "--log-level",
    "--max-sequences-per-request",
    "--limit-concurrency",
    "--header-timeout",
)


def test_help_lists_every_flag_and_the_environment(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in FLAGS:
        assert flag in text, flag
    assert "OCTAVO_MAX_MODEL_LEN" in text and "OCTAVO_API_KEY" in text
    for architecture in supported_architectures():  # the model registry's, every one
        assert architecture in text.replace(", ", ","), architecture


def test_defaults():
    args = parse()
    assert args.model is None and args.port == 8000 and args.enable_prefix_caching is True
    assert args.max_queue_len is None and args.api_key is None and args.log_level == "info"


def test_environment_sets_defaults_and_flags_win(monkeypatch):
    monkeypatch.setenv("OCTAVO_MAX_MODEL_LEN", "123")
    monkeypatch.setenv("OCTAVO_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("OCTAVO_SERVED_MODEL_NAME", "a, b")
    monkeypatch.setenv("OCTAVO_API_KEY", "k")
    monkeypatch.setenv("OCTAVO_KV_CACHE_MEMORY", "1GiB")
    monkeypatch.setenv("OCTAVO_MODEL", "/models/x")
    args = parse()
    assert args.max_model_len == 123 and args.enable_prefix_caching is False
    assert args.served_model_name == ["a", "b"] and args.api_key == "k"
    assert args.kv_cache_memory == 2**30 and args.model == "/models/x"
    args = parse("/models/y", "--max-model-len", "7", "--enable-prefix-caching")
    assert args.max_model_len == 7 and args.enable_prefix_caching is True
    assert args.model == "/models/y"


def test_bad_environment_values_are_refused(monkeypatch, capsys):
    monkeypatch.setenv("OCTAVO_PORT", "eighty")
    with pytest.raises(SystemExit):
        parse()
    assert "--port" in capsys.readouterr().err
    monkeypatch.delenv("OCTAVO_PORT")
    monkeypatch.setenv("OCTAVO_ENABLE_PREFIX_CACHING", "maybe")
    with pytest.raises(ValueError, match="OCTAVO_ENABLE_PREFIX_CACHING"):
        parse()


def test_sizes():
    assert parse_size("4096") == 4096
    assert parse_size("4GiB") == 4 * 2**30
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("2G") == 2 * 10**9
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")


def test_a_layout_the_model_cannot_take_is_refused_before_serving(smol_folder, capsys):
    """SmolLM2 has 9 attention heads: 2 ranks cannot split them (3 can)."""
    code = main(["serve", str(smol_folder), "--tensor-parallel-size", "2"])
    assert code == 2
    assert "attention heads (9) cannot be split evenly over tensor_parallel_size 2" in (
        capsys.readouterr().err
    )


def test_missing_model_folder_is_refused_before_serving(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nope")]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--hos", "127.0.0.1"],
        ["--po", "1"],
        ["--served", "evil"],
        ["--api-k", "plaintext"],
        ["--hos", "127.0.0.1", "--po", "1", "--served", "evil", "--api-k", "plaintext"],
    ],
)
def test_abbreviated_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *argv])
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {argv[0]}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["prepare-model", "--int", "/tmp"],
    ],
)
def test_other_subcommands_refuse_abbreviations_too(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err


def test_serve_config_defaults_limit_concurrency_from_max_num_seqs():
    assert parse().limit_concurrency is None  # resolved by serve(): 2 × --max-num-seqs, ≥ 512
    assert parse("--max-sequences-per-request", "64").max_sequences_per_request == 64
    assert parse("--header-timeout", "2.5").header_timeout == 2.5


def test_every_engine_argument_is_a_flag_with_an_environment_variable(capsys, monkeypatch):
    """EngineArgs is the one declaration: each field (but the positional model) is a flag,
    listed in --help with its OCTAVO_* variable, and the variable sets it."""
    import dataclasses

    from octavo.config import EngineArgs

    engine_fields = [f.name for f in dataclasses.fields(EngineArgs) if f.name != "model"]
    assert sorted(o.dest for o in options.ENGINE_OPTIONS) == sorted(engine_fields)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in options.OPTIONS:
        assert option.flag in text and f"[env {option.env}]" in text, option.flag
    monkeypatch.setenv("OCTAVO_SEED", "42")
    monkeypatch.setenv("OCTAVO_BLOCK_SIZE", "32")
    args = parse("--max-num-seqs", "7")
    assert (args.seed, args.block_size, args.max_num_seqs) == (42, 32, 7)
