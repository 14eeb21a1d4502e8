"""Loading and unloading LoRA adapters while serving (vLLM's routes; the API key guards
them like every /v1 route). Registered only with ``--allow-runtime-lora-updating`` (or
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=true``): without it, as in vLLM, they are 404s."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from octavo.entrypoints.openai.context import ServerContext, get_context

router = APIRouter()
Context = Annotated[ServerContext, Depends(get_context)]


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoRAAdapterRequest, context: Context) -> PlainTextResponse:
    context.ready_info()  # 503 while the engine loads: adapters are known after that
    adapters = context.adapters()
    names = context.config.served_model_names
    roots = context.config.lora_allowed_roots
    await adapters.load(context.engine, body.lora_name, body.lora_path, names, roots)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(
    body: UnloadLoRAAdapterRequest, context: Context
) -> PlainTextResponse:
    context.ready_info()
    await context.adapters().unload(context.engine, body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
