"""Whether a hub model can be fetched, asked once before the server opens its port.

A machine that cannot reach the Hub used to retry for half a minute, open the port, and
die in the engine core with a traceback. ``ensure_fetchable`` asks the Hub once (no
retries): a repository it cannot serve, or a Hub it cannot reach with no cached copy, is a
``ModelFetchError`` (``octavo`` prints its one line and exits 1); a cached copy is served
offline instead, with a warning.
"""

from __future__ import annotations

import logging
import os

from octavo.model_executor.hub import HubModel, cached_snapshot, hub_cache_dir, hub_offline

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 10.0
WHAT_TO_DO = (
    "to serve without the Hub, set HF_HUB_OFFLINE=1 with a cache that holds the model "
    "(HF_HUB_CACHE, filled where the Hub is reachable), or serve a local folder "
    "(octavo serve /models/NAME, e.g. a mounted PVC)"
)


class ModelFetchError(ValueError):
    """The model cannot be fetched: what was tried, why it failed and what to do."""


def ensure_fetchable(hub: HubModel) -> None:
    """Return when ``hub`` can be downloaded, or is cached and the Hub is unreachable (then
    ``HF_HUB_OFFLINE=1`` is set for this process and the engine core it starts)."""
    if hub_offline():
        return
    failure = _probe(hub)
    if failure is None:
        return
    reason, reachable = failure
    if not reachable and cached_snapshot(hub) is not None:
        logger.warning("%s; serving %s from the cache %s", reason, hub.uri, hub_cache_dir())
        os.environ["HF_HUB_OFFLINE"] = "1"
        return
    raise ModelFetchError(f"cannot fetch model {hub.uri!r}: {reason}; {WHAT_TO_DO}")


def _probe(hub: HubModel) -> tuple[str, bool] | None:
    """None when the Hub has the repository; else why not, and whether the Hub answered."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = constants.ENDPOINT
    try:
        HfApi().model_info(hub.repo_id, revision=hub.revision, timeout=PROBE_TIMEOUT_SECONDS)
    except GatedRepoError:
        return f"{hub.repo_id} is gated on {endpoint}: accept its terms and set HF_TOKEN", True
    except RepositoryNotFoundError:
        why = "no such repository, or it is private (set HF_TOKEN)"
        return f"{endpoint} has no model {hub.repo_id} ({why})", True
    except RevisionNotFoundError:
        return f"{hub.repo_id} on {endpoint} has no revision {hub.revision!r}", True
    except HfHubHTTPError as error:
        return f"the Hugging Face Hub at {endpoint} answered {_status(error)}", False
    except Exception as error:  # the transport's own errors: DNS, refused, timed out
        return f"the Hugging Face Hub at {endpoint} could not be reached ({error})", False
    return None


def _status(error: Exception) -> str:
    response = getattr(error, "response", None)
    code = getattr(response, "status_code", None)
    return f"HTTP {code}" if code is not None else str(error)
