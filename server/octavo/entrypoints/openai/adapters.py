"""The LoRA adapters this server serves by name: ``--lora-modules`` and run-time loads.

Requests name an adapter in ``model``; ``/v1/models`` lists each with the base model as
``parent``. With ``--allow-runtime-lora-updating``, ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` change the set while serving (one change at a time): a local
path must be an adapter folder under the allowed roots (``AllowedRoots``; the engine is
given its real path), a hub adapter (``hf://ORG/NAME``, or vLLM's bare ``ORG/NAME``;
limited by ``hf://`` allowed roots when there are any) is downloaded first, off the event
loop and off the engine loop (``AdapterDownloads``). The engine checks an adapter before
its name is served, so a bad one is a 400 and everything else keeps serving.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from octavo.engine.async_engine import AsyncEngine
from octavo.engine.core_messages import LoadAdapter, UnloadAdapter
from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.adapter_downloads import AdapterDownloads
from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.lora.adapter_source import hub_adapter
from octavo.lora.allowed_roots import AllowedRoots
from octavo.lora_request import LoRARequest
from octavo.model_executor.hub import HF_SCHEME, HubModel, is_repo_id


@dataclass
class ServedAdapters:
    enabled: bool
    by_name: dict[str, LoRARequest]
    next_id: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    downloads: AdapterDownloads = field(default_factory=AdapterDownloads)
    module_paths: list[str] = field(default_factory=list)  # --lora-modules, as given
    roots: AllowedRoots | None = None  # made on the first run-time load

    @classmethod
    def from_info(cls, info: EngineInfo) -> ServedAdapters:
        loaded = dict(info.startup_adapters.loaded)
        first_free = 1 + max((r.lora_int_id for r in loaded.values()), default=0)
        paths = [request.lora_path for request in loaded.values()]
        return cls(info.enable_lora, loaded, first_free, module_paths=paths)

    async def load(
        self,
        engine: AsyncEngine,
        name: str,
        path: str,
        taken: list[str],
        allowed_roots: list[str] | None,
    ) -> None:
        """Check and serve the adapter at ``path`` as ``name``; APIError when refused."""
        if not self.enabled:
            raise bad_request("LoRA adapters need a server started with --enable-lora")
        self._check_free(name, taken)
        source = await self._source(path, allowed_roots)
        async with self.lock:
            self._check_free(name, taken)
            request = LoRARequest(name, self.next_id, source)
            try:
                await engine.change_adapter(LoadAdapter(uuid.uuid4().hex, request))
            except ValueError as error:
                message = str(error).replace(source, path)  # the caller's spelling
                raise bad_request(message, param="lora_path") from None
            self.by_name[name] = request
            self.next_id += 1

    def _check_free(self, name: str, taken: list[str]) -> None:
        if name in self.by_name or name in taken:
            raise bad_request(
                f"The lora adapter '{name}' has already been loaded.", param="lora_name"
            )

    async def _source(self, path: str, allowed_roots: list[str] | None) -> str:
        """What the engine reads: a local adapter's real path, or a downloaded hub
        adapter's ``hf://`` reference (the engine finds it in the cache)."""
        roots = self._allowed_roots(allowed_roots)
        try:
            hub = hub_adapter(path) if path.startswith(HF_SCHEME) else None
            if hub is None:
                return roots.local_folder(path)
        except ValueError as error:
            if not is_repo_id(path):
                raise bad_request(str(error), param="lora_path") from None
            hub = HubModel(path)  # vLLM's bare ORG/NAME, when no allowed folder has it
        try:
            roots.check_hub(hub, path)
        except ValueError as error:
            raise bad_request(str(error), param="lora_path") from None
        await self.downloads.fetch(hub)
        return hub.uri

    def _allowed_roots(self, allowed_roots: list[str] | None) -> AllowedRoots:
        if self.roots is None:
            self.roots = AllowedRoots.of(allowed_roots, self.module_paths)
        return self.roots

    async def unload(self, engine: AsyncEngine, name: str) -> None:
        """Stop serving ``name`` (its running requests finish); 404 when not served."""
        async with self.lock:
            request = self.by_name.get(name)
            if request is None:
                raise APIError(
                    404,
                    f"The lora adapter '{name}' cannot be found.",
                    type="NotFoundError",
                    param="lora_name",
                    code="lora_not_found",
                )
            await engine.change_adapter(UnloadAdapter(uuid.uuid4().hex, request.lora_int_id))
            del self.by_name[name]
