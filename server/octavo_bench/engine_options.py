"""The engine's options in a benchmark's parser, spelled, typed and explained as
``octavo serve`` spells them: from ``EngineArgs``' declarations (``--num-threads``,
``--kv-cache-memory 4GiB``, ``--dtype ...``), with the benchmark's own defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from octavo.entrypoints.openai.options import ENGINE_OPTIONS, Option


def add_engine_options(parser: argparse.ArgumentParser, defaults: Mapping[str, Any]) -> None:
    """One flag per ``EngineArgs`` field named in ``defaults`` (field -> this benchmark's
    default); KeyError for a name that is not an engine argument."""
    by_dest = {option.dest: option for option in ENGINE_OPTIONS}
    for name, default in defaults.items():
        option = by_dest[name]
        shown = "the engine's" if default is None else default
        help_text = f"{option.help} (default here: {shown}) [as octavo serve {option.flag}]"
        if option.kind == "bool":
            parser.add_argument(
                option.flag, action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
            continue
        parser.add_argument(
            option.flag,
            type=_concrete(option),
            default=default,
            choices=option.choices,
            metavar=option.dest.upper() if option.choices is None else None,
            help=help_text,
        )


def _concrete(option: Option) -> Callable[[str], Any]:
    """The option's own parser; ``--dtype auto`` names the dtype it picks on this CPU (the
    benchmarks report it and hand it to their Hugging Face baselines)."""
    if option.dest != "dtype":
        return option.type

    def dtype(text: str) -> str:
        value = option.type(text)
        return default_dtype() if value == "auto" else value

    dtype.__name__ = "dtype"
    return dtype


def default_dtype() -> str:
    """bfloat16 where the CPU computes it natively, else float32 (``--dtype auto`` on CPU)."""
    import torch

    from octavo.engine.device import select_dtype

    dtype = select_dtype("auto", torch.device("cpu"))
    return "bfloat16" if dtype == torch.bfloat16 else "float32"


def threads_used(num_threads: int | None) -> int:
    """``--num-threads``, or the CPUs this process may use (what the engine takes)."""
    from octavo.kernels.cpu_count import usable_cpus

    return num_threads or usable_cpus()
