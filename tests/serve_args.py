"""Parsing ``octavo serve`` command lines in tests, with no OCTAVO_* variables leaking in."""

from __future__ import annotations

import argparse

import pytest

from octavo.cli import build_parser
from octavo.entrypoints.openai import options
from octavo.entrypoints.openai.cli_spellings import vllm_spellings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Imported by a test module, this removes every OCTAVO_* option variable for its tests."""
    for option in options.OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.delenv(options.MODEL_ENV, raising=False)


def parse(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(vllm_spellings(["serve", *argv]))
    options.finish(args)
    return args
