"""Where a LoRA adapter's files are: a local folder, ``file://PATH`` or ``hf://ORG/NAME[@REV]``
(the cached snapshot, or downloaded). Torch-free: the server's API process resolves and
downloads adapters before the engine loads them (``peft_adapter.py``)."""

from __future__ import annotations

from pathlib import Path

from octavo.lora.adapter_config import CONFIG_FILE, WEIGHTS_FILE, not_an_adapter
from octavo.model_executor.hub import (
    HubModel,
    cached_snapshot,
    download_snapshot,
    parse_hub_model,
)

ADAPTER_FILES = [CONFIG_FILE, WEIGHTS_FILE]  # all a hub adapter download fetches


def adapter_folder(path: str) -> Path:
    """A local folder, ``file://PATH`` or ``hf://ORG/NAME[@REV]`` (the cached snapshot, or
    downloaded unless ``HF_HUB_OFFLINE``); ValueError when it is none of them."""
    hub = hub_adapter(path)
    if hub is not None:
        folder = cached_snapshot(hub) or fetch_adapter(hub)
        if not (folder / CONFIG_FILE).is_file():
            raise not_an_adapter(path)
        return folder
    folder = Path(path.removeprefix("file://")).expanduser()
    if not folder.is_dir():
        raise not_an_adapter(path)
    return folder


def hub_adapter(path: str) -> HubModel | None:
    """The hub repository ``path`` names, None for a local path; ValueError if malformed."""
    try:
        return parse_hub_model(path)
    except ValueError as error:
        raise ValueError(f"LoRA adapter {path}: {error}") from None


def fetch_adapter(hub: HubModel) -> Path:
    """Download (unless offline) the adapter files of ``hub``; its snapshot folder."""
    try:
        return download_snapshot(hub, marker=CONFIG_FILE, patterns=ADAPTER_FILES)
    except ValueError as error:
        raise ValueError(f"LoRA adapter {hub.uri!r}: {_hub_reason(error)}") from error


def _hub_reason(error: ValueError) -> str:
    """Why a download failed, without the server's cache folder in it."""
    text = str(error)
    if "not in the local Hugging Face cache" in text:
        return "not in the local Hugging Face cache, and it could not be downloaded"
    if f"has no {CONFIG_FILE}" in text:
        return f"the repository has no {CONFIG_FILE}: not a LoRA adapter"
    return text.split(": ", 1)[-1]
