"""InferenceService helpers for the e2e tests: build, create, read conditions, wait."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from e2e.helpers import wait_for

GROUP, VERSION, PLURAL = "octavo.dev", "v1alpha1", "inferenceservices"
FAKE_IMAGE = "registry.invalid/octavo/server:e2e"  # never pulled: kwok plays the kubelet


def manifest(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"image": FAKE_IMAGE, "resources": {"gpu": 1}, **(spec or {})},
    }


def create(custom: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> dict:
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def get(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def patch(custom: client.CustomObjectsApi, namespace: str, name: str, body: dict) -> dict:
    return custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return cond
    return {}


def wait_condition(
    custom: client.CustomObjectsApi,
    namespace: str,
    name: str,
    kind: str,
    status: str,
    reason: str | None = None,
    timeout: float = 60,
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = get(custom, namespace, name)
        cond = condition(obj, kind)
        ok = cond.get("status") == status and (reason is None or cond.get("reason") == reason)
        return obj if ok else None

    return wait_for(
        check,
        timeout=timeout,
        what=f"{name} {kind}={status}" + (f" ({reason})" if reason else ""),
        describe=lambda: get(custom, namespace, name).get("status"),
    )


def events_for(core: client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    selector = f"involvedObject.name={name},involvedObject.kind=InferenceService"
    return core.list_namespaced_event(namespace, field_selector=selector).items
