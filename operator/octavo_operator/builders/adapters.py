"""LoRA adapters of `spec.adapters`: where the server finds each, and the ConfigMap that
tells a starting pod which to load.

The pod reads the list from the ConfigMap (`OCTAVO_LORA_MODULES`, read when the
container starts), so a changed list changes no pod template and restarts no pod: the
operator loads and unloads the difference through each ready pod's API instead
(`adapter_sync`), and a pod started later loads the new list before it reports Ready.
"""

from __future__ import annotations

from typing import Any

from octavo_operator.api.service import InferenceService
from octavo_operator.api.spec import Adapter

from .metadata import metadata

ADAPTERS_PATH = "/adapters"  # pvc:// adapters' claims are mounted under it, read-only
LORA_MODULES_KEY = "lora-modules"
LORA_MODULES_ENV = "OCTAVO_LORA_MODULES"


def lora_args() -> list[str]:
    """LoRA on, and the run-time load routes the operator syncs adapters through (the
    server keeps them off unless asked). Run-time loads may read the adapters named when
    the pod started and anything on the claims mounted under ADAPTERS_PATH; a file://
    adapter added later must lie under a folder named with `--lora-allowed-roots` in
    engine.extraArgs (which replaces this list: name ADAPTERS_PATH there too if needed).
    The flags do not depend on the list, so a changed list restarts no pod."""
    return ["--enable-lora", "--allow-runtime-lora-updating", "--lora-allowed-roots", ADAPTERS_PATH]


def adapters_config_map_name(isvc: InferenceService) -> str:
    return f"{isvc.name}-adapters"


def adapter_path(adapter: Adapter) -> str:
    """What the server loads: the mounted folder, the image path, or the hub reference."""
    if adapter.scheme == "pvc":
        claim, path = adapter.claim_and_path
        return f"{ADAPTERS_PATH}/{claim}/{path}".rstrip("/")
    if adapter.scheme == "file":
        return adapter.uri.removeprefix("file://")
    return adapter.uri


def adapter_claims(isvc: InferenceService) -> list[str]:
    """The claims pvc:// adapters live on, each mounted once, in first-named order."""
    claims = [a.claim_and_path[0] for a in isvc.adapters or () if a.scheme == "pvc"]
    return list(dict.fromkeys(claims))


def lora_modules_value(isvc: InferenceService) -> str:
    return " ".join(f"{a.name}={adapter_path(a)}" for a in isvc.adapters or ())


def adapters_config_map(isvc: InferenceService) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(isvc, adapters_config_map_name(isvc)),
        "data": {LORA_MODULES_KEY: lora_modules_value(isvc)},
    }


def lora_modules_env(isvc: InferenceService) -> dict[str, Any]:
    ref = {"name": adapters_config_map_name(isvc), "key": LORA_MODULES_KEY}
    return {"name": LORA_MODULES_ENV, "valueFrom": {"configMapKeyRef": ref}}


def adapter_claim_volume_name(index: int) -> str:
    return f"adapters-{index}"


def adapter_volumes(isvc: InferenceService) -> list[dict[str, Any]]:
    return [
        {
            "name": adapter_claim_volume_name(i),
            "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
        }
        for i, claim in enumerate(adapter_claims(isvc))
    ]


def adapter_mounts(isvc: InferenceService) -> list[dict[str, Any]]:
    return [
        {
            "name": adapter_claim_volume_name(i),
            "mountPath": f"{ADAPTERS_PATH}/{claim}",
            "readOnly": True,
        }
        for i, claim in enumerate(adapter_claims(isvc))
    ]
