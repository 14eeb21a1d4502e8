"""The PersistentVolumeClaim the operator creates for the model cache (cache.size)."""

from __future__ import annotations

from typing import Any

from octavo_operator.api.service import InferenceService

from .metadata import cache_claim_name, metadata


def cache_claim(isvc: InferenceService) -> dict[str, Any]:
    """Owned by the InferenceService like every child, so deleting the service frees the
    space; to keep weights across services, create a claim and name it in cache.claimName."""
    cache = isvc.cache
    assert cache is not None and cache.size is not None
    spec: dict[str, Any] = {
        "accessModes": [cache.access_mode],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name:
        spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(isvc, cache_claim_name(isvc), component="cache"),
        "spec": spec,
    }
