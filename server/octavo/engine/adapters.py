"""The LoRA adapters an engine knows: checked once when added, forgotten when removed.

An adapter is read and checked against the base model when it is added (``add``: by the
server's load route, ``--lora-modules`` at start, or a request naming a new one); the
workers load it into a slot only when a step schedules it. Removing one stops new
requests from naming it; the workers drop its weights once no request uses it.
"""

from __future__ import annotations

import logging

from octavo.lora.adapter_source import fetch_adapter, hub_adapter
from octavo.lora.peft_adapter import load_peft_adapter
from octavo.lora_request import LoRAModulePath, LoRARequest, StartupAdapters
from octavo.model_executor.model_config import ModelConfig
from octavo.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class EngineAdapters:
    def __init__(
        self, enabled: bool, config: ModelConfig, max_rank: int, scheduler: Scheduler
    ) -> None:
        self.enabled, self.config, self.max_rank = enabled, config, max_rank
        self.scheduler = scheduler
        self.known: dict[int, LoRARequest] = {}  # checked adapters by lora_int_id

    def add(self, request: LoRARequest) -> None:
        """Check ``request``'s adapter (once per id); ValueError naming what is wrong."""
        if not self.enabled:
            raise ValueError("LoRA adapters need an engine started with enable_lora")
        known = self.known.get(request.lora_int_id)
        if known is not None and known.lora_path == request.lora_path:
            return
        if known is not None:
            raise ValueError(f"lora_int_id {request.lora_int_id} is already {known.lora_path}")
        _check(request.lora_path, self.config, self.max_rank)
        self.known[request.lora_int_id] = request
        self.scheduler.lora_unloads.discard(request.lora_int_id)

    def remove(self, lora_int_id: int) -> bool:
        """Forget an adapter; False when it was not known."""
        if self.known.pop(lora_int_id, None) is None:
            return False
        self.scheduler.lora_unloads.add(lora_int_id)
        return True

    def load_modules(self, modules: list[LoRAModulePath]) -> StartupAdapters:
        """Add ``--lora-modules`` (ids 1, 2, ...), hub ones downloaded now (refreshed
        unless offline); a bad one is logged in one line and left out."""
        out = StartupAdapters()
        for lora_int_id, module in enumerate(modules, start=1):
            try:
                request = LoRARequest(module.name, lora_int_id, module.path)
                hub = hub_adapter(module.path)
                if hub is not None:
                    fetch_adapter(hub)
                self.add(request)
            except ValueError as error:
                logger.error("LoRA adapter %s not served: %s", module.name, error)
                out.failed[module.name] = str(error)
                continue
            out.loaded[module.name] = request
        return out


def _check(path: str, config: ModelConfig, max_rank: int) -> None:
    """Read and check the adapter at ``path``: ValueError naming what is wrong. Anything
    else a malformed adapter trips is a ValueError too (logged with its traceback), so a
    bad adapter is refused and never stops the engine or turns into a 500."""
    try:
        load_peft_adapter(path, config, max_rank)
    except ValueError:
        raise
    except Exception:
        logger.exception("reading LoRA adapter %s failed", path)
        raise ValueError(
            f"LoRA adapter {path}: it could not be read as a PEFT LoRA adapter "
            "(the server log has the details)"
        ) from None
