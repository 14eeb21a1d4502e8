"""Single files of a hub model (``generation_config.json``), without its whole snapshot."""

from __future__ import annotations

import logging
from pathlib import Path

from octavo.model_executor.hub import HubModel, hub_cache_dir, hub_offline

logger = logging.getLogger(__name__)


def download_file(hub: HubModel, filename: str) -> Path | None:
    """One file of ``hub`` (cached; downloaded unless offline), or None when the repository
    has no such file, or it cannot be had now (logged)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
    )

    try:
        path = hf_hub_download(
            hub.repo_id,
            filename,
            revision=hub.revision,
            cache_dir=hub_cache_dir(),
            local_files_only=hub_offline(),
        )
    except RemoteEntryNotFoundError:  # the repository has no such file
        return None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as error:  # not reachable now
        logger.warning("model %s: no %s (%s); going without it", hub.uri, filename, error)
        return None
    except EntryNotFoundError:
        return None
    return Path(path)
