"""Where a run-time adapter load (``POST /v1/load_lora_adapter``) may read.

A local path is loadable when, with every symlink resolved, it is a folder under one of
the allowed roots (``--lora-allowed-roots``, and the folders of ``--lora-modules``, which
the operator named itself) holding ``adapter_config.json`` that also resolves under that
root (and ``adapter_model.safetensors``, when present, likewise). Anything else (outside
the roots, missing, not a folder, no config) gets the same ``not_an_adapter`` answer,
so a caller learns nothing about folders it may not load from.

Hub adapters (``hf://ORG/NAME``) are allowed with the opt-in, as in vLLM; roots spelled
``hf://ORG`` or ``hf://ORG/NAME`` restrict them to those organisations or repositories.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from octavo.lora.adapter_config import CONFIG_FILE, WEIGHTS_FILE, not_an_adapter
from octavo.model_executor.hub import HF_SCHEME, HubModel, parse_hub_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AllowedRoots:
    folders: tuple[Path, ...]  # resolved
    hub_prefixes: tuple[str, ...] = ()  # ORG or ORG/NAME; none: every hub adapter

    @classmethod
    def of(cls, roots: list[str] | None, module_paths: Iterable[str]) -> AllowedRoots:
        """``--lora-allowed-roots`` plus the local folders of ``--lora-modules``."""
        hub = tuple(
            r.removeprefix(HF_SCHEME).strip("/") for r in roots or () if r.startswith(HF_SCHEME)
        )
        local = [r for r in roots or () if not r.startswith(HF_SCHEME)]
        named = [*local, *(p for p in module_paths if _is_local(p))]
        folders = []
        for text in named:
            folder = Path(text.removeprefix("file://")).expanduser().resolve()
            if not folder.is_dir():
                logger.warning("LoRA allowed root %s is not a folder (yet)", folder)
            folders.append(folder)
        unique = tuple(dict.fromkeys(folders))
        logger.info(
            "run-time LoRA loads may read under %s, and hub adapters %s",
            [str(f) for f in unique] or "no folder",
            list(hub) or "of any repository",
        )
        return cls(unique, hub)

    def check_hub(self, hub: HubModel, path: str) -> None:
        """``not_an_adapter`` unless ``hub`` is under one of the allowed hub prefixes."""
        repo = hub.repo_id
        if self.hub_prefixes and not any(
            repo == prefix or repo.startswith(prefix + "/") for prefix in self.hub_prefixes
        ):
            raise not_an_adapter(path)

    def local_folder(self, path: str) -> str:
        """The real path of the adapter folder ``path`` names; ``not_an_adapter`` unless
        it is one under an allowed root."""
        try:
            real = Path(path.removeprefix("file://")).resolve(strict=True)
            root = self._root_of(real)
            loadable = root is not None and real.is_dir() and self._files_inside(real, root)
        except (OSError, ValueError, RuntimeError):  # a bad name, a symlink loop, no access
            loadable = False
        if not loadable:
            raise not_an_adapter(path)
        return str(real)

    def _root_of(self, real: Path) -> Path | None:
        return next((root for root in self.folders if real.is_relative_to(root)), None)

    @staticmethod
    def _files_inside(folder: Path, root: Path) -> bool:
        config = (folder / CONFIG_FILE).resolve(strict=True)
        weights = (folder / WEIGHTS_FILE).resolve()
        inside = config.is_relative_to(root) and config.is_file()
        return inside and (not weights.exists() or weights.is_relative_to(root))


def _is_local(path: str) -> bool:
    if path.startswith(HF_SCHEME):
        return False
    try:
        return parse_hub_model(path) is None
    except ValueError:
        return False
