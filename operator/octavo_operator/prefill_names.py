"""Whether the names spec.prefill takes are this service's to take.

A service `<name>` with spec.prefill applies `<name>-prefill` (the prefill pool's Deployment)
and `<name>-pd-sidecar` (the routing sidecar's ServiceAccount, Role and RoleBinding). Another
InferenceService may be called `<name>-prefill`, and then its own Deployment has that name;
any of these objects may also be someone else's. Server-side apply with force would take
them over, so before applying, each one found must be controlled by this service. When one
is not, spec.prefill is not honoured (the decode pool serves alone, as with an invalid
spec.prefill) and the status says which object is in the way. An object of an earlier
service of the same name (deleted and created again before the garbage collector took its
children) counts as this service's: the next apply adopts it, as it did before this check.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService
from octavo_operator.kube import Kube, object_path

NAME_TAKEN = "PrefillNameTaken"  # the Degraded and PrefillReady reason


def prefill_objects(isvc: InferenceService) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of the objects spec.prefill applies under a derived name."""
    rbac, sidecar = "rbac.authorization.k8s.io/v1", isvc.sidecar_name
    return [
        ("apps/v1", "Deployment", isvc.prefill_name),
        ("v1", "ServiceAccount", sidecar),
        (rbac, "Role", sidecar),
        (rbac, "RoleBinding", sidecar),
    ]


def get_or_none(kube: Kube, path: str) -> dict[str, Any] | None:
    try:
        return kube.call("GET", path)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def is_ours(isvc: InferenceService, obj: dict[str, Any]) -> bool:
    """Controlled by this service, or by an earlier InferenceService of its name."""
    ref = controller_ref(obj) or {}
    if ref.get("uid") == isvc.uid:
        return True
    return ref.get("kind") == c.KIND and ref.get("name") == isvc.name


def owner_text(obj: dict[str, Any]) -> str:
    """Who controls OBJ, in words, for the status message."""
    ref = controller_ref(obj)
    if ref is None:
        return "no controller (created by hand or by another tool)"
    return f"{ref.get('kind', '?')} {ref.get('name', '?')}"


def prefill_name_conflict(kube: Kube, isvc: InferenceService) -> str | None:
    """Why this service cannot take the names spec.prefill needs, or None (they are free or
    already its own). Checked only for a valid spec.prefill."""
    if not isvc.disaggregated:
        return None
    namesake = object_path(c.API_VERSION, c.KIND, isvc.namespace, isvc.prefill_name)
    if get_or_none(kube, namesake) is not None:
        return (
            f"InferenceService {isvc.prefill_name} exists and its Deployment has the name of "
            f"this service's prefill pool: rename one of the two services"
        )
    for api_version, kind, name in prefill_objects(isvc):
        found = get_or_none(kube, object_path(api_version, kind, isvc.namespace, name))
        if found is not None and not is_ours(isvc, found):
            return (
                f"{kind} {isvc.namespace}/{name} exists and belongs to {owner_text(found)}, "
                "not to this service: rename the service or remove that object"
            )
    return None
