"""Volumes of the server pod: model cache, model claim, /tmp and /dev/shm."""

from __future__ import annotations

from typing import Any

from octavo_operator.api.service import InferenceService

from .adapters import adapter_mounts, adapter_volumes
from .metadata import cache_claim_name

CACHE_PATH = "/cache"
MODELS_PATH = "/models"
SHM_SIZE = "16Gi"  # NCCL's shared-memory transport between tensor/pipeline-parallel workers


def model_argument(isvc: InferenceService) -> str | None:
    """What `octavo serve` gets as its model: None for the embedded default."""
    model = isvc.model
    if model.scheme == "pvc":
        claim, path = model.claim_and_path
        return f"{MODELS_PATH}/{claim}/{path}".rstrip("/")
    if model.scheme == "file":
        return model.uri.removeprefix("file://")  # type: ignore[union-attr]
    return model.uri  # hf://org/name, or None


def cache_volume(isvc: InferenceService) -> dict[str, Any]:
    if isvc.cache is None:
        return {"name": "cache", "emptyDir": {}}
    claim = isvc.cache.claim_name or cache_claim_name(isvc)
    return {"name": "cache", "persistentVolumeClaim": {"claimName": claim}}


def volumes(isvc: InferenceService) -> list[dict[str, Any]]:
    out = [cache_volume(isvc), {"name": "tmp", "emptyDir": {}}]
    if isvc.model.scheme == "pvc":
        claim, _ = isvc.model.claim_and_path
        out.append(
            {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    if isvc.engine.world_size > 1:
        out.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}})
    return out + adapter_volumes(isvc)


def volume_mounts(isvc: InferenceService) -> list[dict[str, Any]]:
    out = [{"name": "cache", "mountPath": CACHE_PATH}, {"name": "tmp", "mountPath": "/tmp"}]
    if isvc.model.scheme == "pvc":
        claim, _ = isvc.model.claim_and_path
        out.append({"name": "model", "mountPath": f"{MODELS_PATH}/{claim}", "readOnly": True})
    if isvc.engine.world_size > 1:
        out.append({"name": "shm", "mountPath": "/dev/shm"})
    return out + adapter_mounts(isvc)
