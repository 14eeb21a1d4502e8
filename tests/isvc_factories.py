"""InferenceService bodies for the operator's unit tests."""

from __future__ import annotations

from typing import Any

from octavo_operator.api.service import InferenceService


def body(spec: dict[str, Any] | None = None, name: str = "chat", **meta: Any) -> dict[str, Any]:
    metadata = {"name": name, "namespace": "team-a", "uid": "uid-1", "generation": 3, **meta}
    return {
        "apiVersion": "octavo.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": spec or {},
    }


def isvc(spec: dict[str, Any] | None = None, **meta: Any) -> InferenceService:
    return InferenceService.from_body(body(spec, **meta))
