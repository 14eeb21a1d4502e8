"""Where a model and its tokenizer are: a local folder, a GGUF file (its config and
tokenizer converted once), a hub model (downloaded), or the embedded default; the
tokenizer; the model's sampling defaults. Torch-free: the server's API process checks a
model reference before its port opens (``check_model_early``) without the engine, which
loads the weights (``loader.py``)."""

from __future__ import annotations

import logging
from pathlib import Path

from octavo.model_executor.embedded import embedded_model_folder
from octavo.model_executor.hub import download_snapshot, hub_offline, parse_hub_model
from octavo.model_executor.hub_files import download_file
from octavo.model_executor.hub_reach import ensure_fetchable
from octavo.model_executor.model_config import generation_defaults
from octavo.progress import PhaseReporter

logger = logging.getLogger(__name__)


def resolve_model_folder(model: str | None, revision: str | None = None) -> Path:
    """``None`` means the embedded default; else a hub model or a local Hugging Face folder."""
    if model is None:
        return embedded_model_folder()
    hub = parse_hub_model(model, revision)
    if hub is not None:
        return download_snapshot(hub)
    if revision:
        logger.warning("--revision %s ignored: %s is a local folder", revision, model)
    folder = Path(model.removeprefix("file://")).expanduser()
    if folder.suffix == ".gguf" and folder.is_file():
        from octavo.model_executor.gguf_folder import gguf_model_folder

        with PhaseReporter("converting GGUF metadata", 1, "files") as progress:
            converted = gguf_model_folder(folder)  # config and tokenizer, cached after once
            progress.update()
        return converted
    if not (folder / "config.json").is_file():
        raise ValueError(f"model path {str(folder)!r} is not a folder with a config.json")
    return folder


def check_model_early(model: str | None, revision: str | None = None) -> None:
    """Refuse a bad model reference before a server opens its port, without downloading.

    Local folders must exist; hub references must parse, and when offline they must be
    in the local cache. Online downloads are left to the engine load (behind /health 503).
    """
    if model is None:
        return
    hub = parse_hub_model(model, revision)
    if hub is None:
        resolve_model_folder(model, revision)
    elif hub_offline():
        download_snapshot(hub)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
TOKENIZER_PATTERNS = ["*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken"]  # no weights


def resolve_tokenizer_folder(model_folder: Path, tokenizer: str | None = None) -> Path:
    """The folder the tokenizer is loaded from: ``--tokenizer`` (a local folder or a hub
    model), else the model's own folder; ValueError when it holds no tokenizer."""
    if tokenizer is None:
        return model_folder
    hub = parse_hub_model(tokenizer)
    if hub is not None:
        return download_snapshot(hub, "tokenizer_config.json", TOKENIZER_PATTERNS)
    folder = Path(tokenizer.removeprefix("file://")).expanduser()
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"--tokenizer {str(folder)!r} is not a folder with a tokenizer "
            f"({' or '.join(TOKENIZER_FILES)})"
        )
    return folder


def load_tokenizer(folder: Path, tokenizer: str | None = None):
    """The tokenizer of ``folder`` (or of ``--tokenizer``). No code shipped with a model is
    ever run: ``trust_remote_code`` stays False."""
    from transformers import AutoTokenizer

    source = resolve_tokenizer_folder(folder, tokenizer)
    return AutoTokenizer.from_pretrained(source, trust_remote_code=False)


def sampling_defaults(mode: str, model: str | None, revision: str | None = None) -> dict:
    """``--generation-config``: ``vllm`` gives none; ``auto`` reads the model's
    generation_config.json (a hub model's alone is fetched; the embedded model has none);
    any other value is a folder holding one. A hub model is first checked to be fetchable
    at all (``ensure_fetchable``: the first network use of ``octavo serve``)."""
    hub = parse_hub_model(model, revision) if model is not None else None
    if hub is not None:
        ensure_fetchable(hub)  # a Hub that cannot serve it: one clear line, exit 1
    if mode == "vllm":
        return {}
    if mode != "auto":
        return generation_defaults(generation_config_folder(mode))
    if model is None:
        return {}  # the embedded GGUF carries no sampling defaults
    if hub is None:
        return generation_defaults(resolve_model_folder(model, revision))
    found = download_file(hub, "generation_config.json")
    return {} if found is None else generation_defaults(found.parent)


def generation_config_folder(value: str) -> Path:
    folder = Path(value.removeprefix("file://")).expanduser()
    if not (folder / "generation_config.json").is_file():
        raise ValueError(
            f"--generation-config {value!r} is not auto, vllm or a folder holding a "
            "generation_config.json"
        )
    return folder
