"""The prefill pool of spec.prefill: a Deployment `<name>-prefill` built, like the decode
pool's, from a copy of the service that carries the prefill pool's replicas, resources and
engine flags (spec.engine's, then prefill.engine.extraArgs)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from octavo_operator.api.service import InferenceService

from .deployment import deployment


def prefill_view(isvc: InferenceService) -> InferenceService:
    """The service as its prefill pool: prefill.replicas and no autoscaling (spec.replicas
    and the HPA are the decode pool's); the same model, adapters and engine settings (the
    KV blocks a decode engine pulls must be what it would have computed)."""
    prefill = isvc.prefill
    assert prefill is not None
    extra_args = (*isvc.engine.extra_args, *prefill.extra_args)
    return replace(
        isvc,
        prefill_view=True,
        replicas=prefill.replicas,
        resources=prefill.resources,
        engine=replace(isvc.engine, extra_args=extra_args),
        autoscaling=None,
    )


def prefill_deployment(isvc: InferenceService, image: str) -> dict[str, Any]:
    return deployment(prefill_view(isvc), image)
