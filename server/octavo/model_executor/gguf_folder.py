"""A folder for a ``.gguf`` model file: its config and tokenizer, and a link to the file.

``--model path/to/model.gguf`` (what llama.cpp users have) runs with its weights kept
quantized from the file itself; the engine still wants a Hugging Face ``config.json`` and
tokenizer, which transformers reads out of the GGUF's metadata (~7 s of CPU for a
49k-token vocabulary). They are a function of the file's header alone (its metadata and
tensor table, ahead of the tensor data), so they are written once per header into the
cache (``gguf/headers/<sha256 of the header>``); each file then gets a folder named
after its path, size and modification time, with those files linked in next to a
``model.gguf`` link (``quantized_checkpoint.GGUF_LINK``). A copy of a file, or another file
with the same header (the same model quantized the same way), reuses the first one's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from octavo.cache_dirs import cache_root, fill_once
from octavo.model_executor.gguf_config import (
    config_from_metadata,
    described_by_octavo,
    plain,
    read_metadata,
)
from octavo.model_executor.quantized_checkpoint import GGUF_LINK

logger = logging.getLogger(__name__)
FOLDER_FORMAT = 3  # bump when what is written changes: old folders are then ignored
METADATA_KEYS = {  # "{arch}.key" -> config attribute, where transformers' GGUF reader skips it
    "attention.key_length": "head_dim",  # Qwen3's and Gemma's head_dim != hidden / heads
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
    "expert_feed_forward_length": "moe_intermediate_size",
}


def gguf_model_folder(path: Path) -> Path:
    path = path.resolve()
    stat = path.stat()
    described = f"{FOLDER_FORMAT}:{path}:{stat.st_size}:{stat.st_mtime_ns}"
    key = hashlib.sha256(described.encode()).hexdigest()[:12]
    target = cache_root() / "gguf" / f"{path.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    header_folder = described_header_folder(path, fallback=key)

    def link_files(staging: Path) -> None:
        for item in header_folder.iterdir():
            _link_or_copy(item, staging / item.name)
        (staging / GGUF_LINK).symlink_to(path)

    return fill_once(target, link_files)


def header_digest(path: Path, fallback: str) -> str:
    """sha256 of the file's bytes ahead of its tensor data (metadata and tensor table);
    ``fallback`` where transformers' reader cannot size the tensor table (a ggml type it
    does not know: the file is then described on its own)."""
    from transformers.integrations.gguf.reader import GgufHeader

    try:
        length = GgufHeader.from_file(str(path)).data_start
    except (ValueError, KeyError, IndexError):
        return fallback
    with path.open("rb") as file:
        header = file.read(length)
    return hashlib.sha256(f"{FOLDER_FORMAT}:".encode() + header).hexdigest()[:16]


def described_header_folder(path: Path, fallback: str) -> Path:
    """The config and tokenizer of ``path``'s header, written on the header's first use."""
    digest = header_digest(path, fallback)
    target = cache_root() / "gguf" / "headers" / digest
    if (target / "config.json").is_file():
        return target
    return fill_once(target, lambda staging: _write_config_and_tokenizer(path, staging))


def _link_or_copy(source: Path, destination: Path) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, destination)


def _write_config_and_tokenizer(path: Path, out: Path) -> None:
    logger.info("reading the config and tokenizer of %s (first use only)", path)
    try:
        config = _read_config(path)
        tokenizer = _read_tokenizer(path)
    except Exception as error:
        raise ValueError(
            f"{path.name}: not a GGUF model transformers can describe ({error})"
        ) from None
    if not config.architectures:  # transformers leaves it unset for GGUF files
        config.architectures = [causal_lm_class(config.model_type)]
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _drop_quantization_config(out / "config.json")


def _read_tokenizer(path: Path):
    """transformers' tokenizer of the file (its generic fast class where transformers has
    no config for the architecture: AutoTokenizer would ask for one)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    metadata, _ = read_metadata(path)
    reader = PreTrainedTokenizerFast if described_by_octavo(metadata) else AutoTokenizer
    return reader.from_pretrained(path.parent, gguf_file=path.name)


def _read_config(path: Path):
    """transformers' reading of the file's config, with the ``METADATA_KEYS`` it skips;
    Octavo's own (``gguf_config``) for the architectures it does not describe."""
    from transformers import AutoConfig

    metadata, tensor_names = read_metadata(path)
    if described_by_octavo(metadata):
        return config_from_metadata(metadata, tensor_names)
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    arch = metadata.get("general.architecture", "")
    for key, attribute in METADATA_KEYS.items():
        if f"{arch}.{key}" in metadata:
            setattr(config, attribute, plain(metadata[f"{arch}.{key}"]))
    return config


def causal_lm_class(model_type: str) -> str:
    """transformers' causal-LM class of ``model_type`` (``gemma3_text`` → Gemma3ForCausalLM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, model_type)


def _drop_quantization_config(path: Path) -> None:
    """The weights come from the GGUF file itself, not from what this config says."""
    raw = json.loads(path.read_text())
    if raw.pop("quantization_config", None) is not None:
        path.write_text(json.dumps(raw, indent=2))
