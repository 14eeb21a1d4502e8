"""``LoRARequest``: which adapter a request runs with (vLLM's spelling), and
``LoRAModulePath``: an adapter named on the command line (``--lora-modules name=path``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int  # > 0; the engine's key for the adapter (and its prefix-cache salt)
    lora_path: str  # a PEFT folder (adapter_config.json + safetensors), or hf://ORG/NAME

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_request: lora_name must not be empty")
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(
                f"lora_request: lora_int_id must be an integer >= 1, got {self.lora_int_id!r}"
            )


@dataclass(frozen=True)
class LoRAModulePath:
    name: str  # what requests put in their ``model`` field
    path: str


def parse_lora_module(text: str) -> LoRAModulePath:
    """``name=path`` or vLLM's JSON ``{"name": ..., "path": ...}``; ValueError otherwise."""
    text = text.strip()
    if text.startswith("{"):
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--lora-modules {text!r}: not JSON ({error.msg})") from None
        name, path = str(fields.get("name", "")), str(fields.get("path", ""))
    else:
        name, _, path = text.partition("=")
    if not name.strip() or not path.strip():
        raise ValueError(
            f'--lora-modules {text!r}: expected NAME=PATH or {{"name": NAME, "path": PATH}}'
        )
    return LoRAModulePath(name.strip(), path.strip())


@dataclass
class StartupAdapters:
    """What ``--lora-modules`` gave: the adapters now served and those that failed."""

    loaded: dict[str, LoRARequest] = field(default_factory=dict)  # by name
    failed: dict[str, str] = field(default_factory=dict)  # name -> why
