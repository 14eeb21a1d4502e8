"""``python -m octavo_bench offline|serve|parallel|structured|quantized|speculative|lora|
random-model|sharegpt-synth|gpu|routed|embeddings|rerank|step-profile|vision|
kv-offload|pd|cpu-attention|cpu-sampling``: the command line."""

from __future__ import annotations

import argparse
import logging
import sys

from octavo_bench import (
    cpu_attention,
    cpu_linear,
    cpu_sampling,
    embeddings,
    gpu,
    kv_offload,
    lora,
    offline,
    parallel,
    pd,
    quantized,
    random_model,
    rerank,
    routed,
    serve,
    sharegpt,
    speculative,
    step_profile,
    structured,
    vision,
)
from octavo_bench.parsers import PROG


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, allow_abbrev=False)
    kinds = parser.add_subparsers(dest="bench_command", required=True)
    offline.register(kinds)
    serve.register(kinds)
    routed.register(kinds)
    parallel.register(kinds)
    structured.register(kinds)
    quantized.register(kinds)
    speculative.register(kinds)
    lora.register(kinds)
    random_model.register(kinds)
    sharegpt.register(kinds)
    gpu.register(kinds)
    embeddings.register(kinds)
    rerank.register(kinds)
    step_profile.register(kinds)
    vision.register(kinds)
    kv_offload.register(kinds)
    pd.register(kinds)
    cpu_attention.register(kinds)
    cpu_linear.register(kinds)
    cpu_sampling.register(kinds)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except ValueError as error:  # bad input: one clear line, no traceback
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
