"""The LoRA adapters this server serves by name: ``--lora-modules`` and run-time loads.

Requests name an adapter in ``model``; ``/v1/models`` lists each with the base model as
``parent``. ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` change the
set while serving (one change at a time); the engine checks an adapter before its name
is served, so a bad one is a 400 and everything else keeps serving.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from octavo.engine.async_engine import AsyncEngine
from octavo.engine.core_messages import LoadAdapter, UnloadAdapter
from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.lora_request import LoRARequest


@dataclass
class ServedAdapters:
    enabled: bool
    by_name: dict[str, LoRARequest]
    next_id: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def from_info(cls, info: EngineInfo) -> ServedAdapters:
        loaded = dict(info.startup_adapters.loaded)
        first_free = 1 + max((r.lora_int_id for r in loaded.values()), default=0)
        return cls(info.enable_lora, loaded, first_free)

    async def load(self, engine: AsyncEngine, name: str, path: str, taken: list[str]) -> None:
        """Check and serve the adapter at ``path`` as ``name``; APIError when refused."""
        if not self.enabled:
            raise bad_request("LoRA adapters need a server started with --enable-lora")
        async with self.lock:
            if name in self.by_name or name in taken:
                raise bad_request(f"The lora adapter '{name}' has already been loaded.",
                                  param="lora_name")  # fmt: skip
            request = LoRARequest(name, self.next_id, path)
            try:
                await engine.change_adapter(LoadAdapter(uuid.uuid4().hex, request))
            except ValueError as error:
                raise bad_request(str(error), param="lora_path") from None
            self.by_name[name] = request
            self.next_id += 1

    async def unload(self, engine: AsyncEngine, name: str) -> None:
        """Stop serving ``name`` (its running requests finish); 404 when not served."""
        async with self.lock:
            request = self.by_name.get(name)
            if request is None:
                raise APIError(404, f"The lora adapter '{name}' cannot be found.",
                               type="NotFoundError", param="lora_name",
                               code="lora_not_found")  # fmt: skip
            await engine.change_adapter(UnloadAdapter(uuid.uuid4().hex, request.lora_int_id))
            del self.by_name[name]
