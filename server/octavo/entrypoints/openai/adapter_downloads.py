"""Hub adapters a run-time load names, downloaded before the engine sees them.

Each download runs in its own daemon thread (never on the event loop, never on the engine
loop, and never holding the process at exit); the route waits at most
``DOWNLOAD_TIMEOUT_S`` for it, and at most ``MAX_DOWNLOADS`` run at once (a stuck one
keeps its place until it ends: a thread cannot be cancelled), so a burst of loads cannot
pile up threads. The engine then reads the adapter from the local cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.lora import adapter_source
from octavo.model_executor.hub import HubModel

logger = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 90.0  # below the operator's 120 s wait for a load
MAX_DOWNLOADS = 2


@dataclass
class AdapterDownloads:
    running: int = 0  # threads not yet finished (changed on the event loop only)

    async def fetch(self, hub: HubModel) -> Path:
        """The adapter's snapshot folder; APIError 400 when it cannot be had in time, 429
        while ``MAX_DOWNLOADS`` downloads are still running."""
        if self.running >= MAX_DOWNLOADS:
            raise APIError(
                429,
                f"{self.running} LoRA adapter downloads are still running; retry later",
                code="too_many_downloads",
                headers={"Retry-After": "5"},
            )
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Path] = loop.create_future()
        result.add_done_callback(lambda done: done.cancelled() or done.exception())  # seen
        self.running += 1
        thread = threading.Thread(
            target=self._download, args=(hub, loop, result), name="lora-download", daemon=True
        )
        thread.start()
        timeout = DOWNLOAD_TIMEOUT_S  # read now: tests shorten it
        try:
            return await asyncio.wait_for(asyncio.shield(result), timeout)
        except TimeoutError:
            raise bad_request(
                f"LoRA adapter {hub.uri!r} did not download within {timeout:g} s", param="lora_path"
            ) from None
        except ValueError as error:
            raise bad_request(str(error), param="lora_path") from None

    def _download(
        self, hub: HubModel, loop: asyncio.AbstractEventLoop, result: asyncio.Future[Path]
    ) -> None:
        try:
            outcome: Path | BaseException = adapter_source.fetch_adapter(hub)
        except ValueError as error:
            outcome = error
        except Exception as error:  # the network, the disk: logged, answered plainly
            logger.warning("downloading LoRA adapter %s failed: %r", hub.uri, error)
            outcome = ValueError(f"LoRA adapter {hub.uri!r} could not be downloaded")
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server is gone
            loop.call_soon_threadsafe(self._finish, result, outcome)

    def _finish(self, result: asyncio.Future[Path], outcome: Path | BaseException) -> None:
        self.running -= 1
        if result.done():  # the route gave up waiting
            return
        if isinstance(outcome, BaseException):
            result.set_exception(outcome)
        else:
            result.set_result(outcome)
