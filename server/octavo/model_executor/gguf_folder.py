"""A folder for a ``.gguf`` model file: its config and tokenizer, and a link to the file.

``--model path/to/model.gguf`` (what llama.cpp users have) runs with its weights kept
quantized from the file itself; the engine still wants a Hugging Face ``config.json`` and
tokenizer, which transformers reads out of the GGUF's metadata. They are written once
into the cache, in a folder named after the file's path, size and modification time, next
to a ``model.gguf`` link (``quantized_checkpoint.GGUF_LINK``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

from octavo.cache_dirs import cache_root
from octavo.model_executor.quantized_checkpoint import GGUF_LINK

logger = logging.getLogger(__name__)
FOLDER_FORMAT = 2  # bump when what is written changes: old folders are then ignored
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def gguf_model_folder(path: Path) -> Path:
    path = path.resolve()
    stat = path.stat()
    described = f"{FOLDER_FORMAT}:{path}:{stat.st_size}:{stat.st_mtime_ns}"
    key = hashlib.sha256(described.encode()).hexdigest()[:12]
    target = cache_root() / "gguf" / f"{path.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".gguf-", dir=target.parent))
    try:
        _write_config_and_tokenizer(path, staging)
        (staging / GGUF_LINK).symlink_to(path)
        if not target.exists():
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_config_and_tokenizer(path: Path, out: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    logger.info("reading the config and tokenizer of %s (first use only)", path)
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as error:
        raise ValueError(
            f"{path.name}: not a GGUF model transformers can describe ({error})"
        ) from None
    if not config.architectures:  # transformers leaves it unset for GGUF files
        config.architectures = [ARCHITECTURES.get(config.model_type, config.model_type)]
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _drop_quantization_config(out / "config.json")


def _drop_quantization_config(path: Path) -> None:
    """The weights come from the GGUF file itself, not from what this config says."""
    raw = json.loads(path.read_text())
    if raw.pop("quantization_config", None) is not None:
        path.write_text(json.dumps(raw, indent=2))
