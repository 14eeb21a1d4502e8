"""Models from the Hugging Face Hub: ``hf://org/name[@revision]`` or a bare ``org/name``.

A model reference is a local folder (``/models/x``, ``file:///models/x``) or a hub
repository. Hub repositories are fetched with ``huggingface_hub.snapshot_download`` into
``$HF_HUB_CACHE`` (default ``$OCTAVO_CACHE/hf``), only the files the engine reads
(config, safetensors, tokenizer, chat template). With ``HF_HUB_OFFLINE=1`` only that
cache is consulted, and a model missing from it is a clear ``ValueError``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from octavo.cache_dirs import cache_root
from octavo.progress import DownloadBar

logger = logging.getLogger(__name__)

HF_SCHEME = "hf://"
# The files a safetensors Llama-family checkpoint needs; never *.bin, *.pth or *.gguf.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"{_NAME}/{_NAME}")
_REVISION = re.compile(r"[A-Za-z0-9._/-]{1,255}")
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubModel:
    """A hub repository and the revision (branch, tag or commit) to load; None = main."""

    repo_id: str
    revision: str | None = None

    @property
    def uri(self) -> str:
        suffix = f"@{self.revision}" if self.revision else ""
        return f"{HF_SCHEME}{self.repo_id}{suffix}"


def parse_hub_model(model: str, revision: str | None = None) -> HubModel | None:
    """The hub model ``model`` names, or None for a local path; ValueError when malformed.

    ``hf://org/name`` and ``hf://org/name@rev`` are hub models; so is a bare ``org/name``
    when no such local path exists. Other ``scheme://`` references are refused.
    """
    if model.startswith(HF_SCHEME):
        return _parse_hf_uri(model, revision)
    if "://" in model and not model.startswith("file://"):
        raise ValueError(
            f"model {model!r}: unsupported scheme; use a local folder, file://PATH "
            "or hf://ORG/NAME[@REVISION]"
        )
    if _REPO_ID.fullmatch(model) and not Path(model).exists():
        return HubModel(model, _check_revision(model, revision))
    return None


def _parse_hf_uri(model: str, revision: str | None) -> HubModel:
    repo_id, _, pinned = model.removeprefix(HF_SCHEME).partition("@")
    if not _REPO_ID.fullmatch(repo_id):
        raise ValueError(
            f"model {model!r}: a hub model is hf://ORG/NAME[@REVISION] (letters, digits, "
            "'.', '_' and '-'), e.g. hf://HuggingFaceTB/SmolLM2-135M-Instruct"
        )
    if pinned and revision and pinned != revision:
        raise ValueError(f"model {model!r} pins revision {pinned!r} but --revision is {revision!r}")
    if "@" in model and not pinned:
        raise ValueError(f"model {model!r}: empty revision after '@'")
    return HubModel(repo_id, _check_revision(model, pinned or revision))


def _check_revision(model: str, revision: str | None) -> str | None:
    if revision is not None and not _REVISION.fullmatch(revision):
        raise ValueError(f"model {model!r}: {revision!r} is not a valid revision")
    return revision or None


def is_repo_id(text: str) -> bool:
    """Whether ``text`` is spelled like a hub repository id (``org/name``)."""
    return _REPO_ID.fullmatch(text) is not None


def served_name(model: str) -> str:
    """The name clients see for ``model``: the repo id for hub models, else ``model``."""
    try:
        hub = parse_hub_model(model)
    except ValueError:
        return model
    return hub.repo_id if hub is not None else model


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``), read now rather than at import."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def hub_cache_dir() -> Path:
    configured = os.environ.get("HF_HUB_CACHE")
    return Path(configured) if configured else cache_root() / "hf"


def download_snapshot(
    hub: HubModel, marker: str = "config.json", patterns: list[str] | None = None
) -> Path:
    """The local snapshot folder of ``hub``, downloaded unless offline; ValueError if absent
    or without ``marker`` (a LoRA adapter's is adapter_config.json). ``patterns``: the
    files to fetch (default ``ALLOW_PATTERNS``)."""
    offline = hub_offline()
    folder = Path(_snapshot_download(hub, offline, patterns or ALLOW_PATTERNS))
    if not (folder / marker).is_file():
        raise ValueError(f"model {hub.uri!r}: the snapshot {folder} has no {marker}")
    logger.info("model %s resolved to %s", hub.uri, folder)
    return folder


def cached_snapshot(hub: HubModel) -> Path | None:
    """The snapshot of ``hub`` already in the local cache (no network), or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            hub.repo_id, revision=hub.revision, cache_dir=hub_cache_dir(), local_files_only=True
        )
    except LocalEntryNotFoundError:
        return None
    return Path(folder)


def _snapshot_download(hub: HubModel, offline: bool, patterns: list[str]) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = hub_cache_dir()
    try:
        return snapshot_download(
            hub.repo_id,
            revision=hub.revision,
            cache_dir=cache,
            allow_patterns=patterns,
            local_files_only=offline,
            tqdm_class=DownloadBar,
        )
    except (GatedRepoError, RepositoryNotFoundError) as error:
        raise ValueError(
            f"model {hub.uri!r}: repository not found or not accessible "
            "(private and gated models need HF_TOKEN)"
        ) from error
    except RevisionNotFoundError as error:
        raise ValueError(f"model {hub.uri!r}: revision {hub.revision!r} not found") from error
    except LocalEntryNotFoundError as error:
        raise ValueError(_not_cached_message(hub, cache, offline)) from error


def _not_cached_message(hub: HubModel, cache: Path, offline: bool) -> str:
    if offline:
        why, fix = "HF_HUB_OFFLINE=1", "unset HF_HUB_OFFLINE to download it"
    else:
        why, fix = "the Hub could not be reached", "check the network and HF_ENDPOINT"
    return (
        f"model {hub.uri!r} is not in the local Hugging Face cache {cache} and {why}; "
        f"{fix}, or pre-load the cache (HF_HUB_CACHE) / mount a volume holding the model"
    )
