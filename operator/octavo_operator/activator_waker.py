"""The activator's API calls (blocking; the activator runs them off its event loop): read
the target service, set it from 0 to 1 replica through /scale, find its ready pods."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client

from octavo_operator import constants as c
from octavo_operator.activator_target import Target
from octavo_operator.adapter_sync import ready_pod_addresses
from octavo_operator.kube import Kube, object_path

logger = logging.getLogger(__name__)


class ServiceWaker:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def caller_namespace(self, ip: str) -> str | None:
        """The namespace of the pod with this IP (a client that called a bare name)."""
        query = [("fieldSelector", f"status.podIP={ip}"), ("limit", "2")]
        try:
            pods = self.kube.call("GET", "/api/v1/pods", query=query).get("items") or []
        except client.ApiException as error:  # e.g. no cluster-wide pod list (watchNamespaces)
            logger.warning("cannot find the pod at %s: %s", ip, error.reason)
            return None
        return pods[0]["metadata"]["namespace"] if len(pods) == 1 else None

    def read(self, target: Target) -> dict[str, Any] | None:
        try:
            return self.kube.call("GET", self._path(target))
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def wake(self, body: dict[str, Any]) -> bool:
        """replicas 0 -> 1 (True), unless it is not 0 any more or changed meanwhile."""
        if ((body.get("spec") or {}).get("replicas") or 0) > 0:
            return False
        meta = body["metadata"]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": {"replicas": 1}}
        target = Target(meta["namespace"], meta["name"])
        try:
            self.kube.merge_patch(self._path(target) + "/scale", patch)
        except client.ApiException as error:
            if error.status == 409:  # someone scaled it meanwhile: read again
                return False
            raise
        logger.info("%s/%s: a request is waiting, scaling from zero", *meta_key(meta))
        return True

    def ready_pod_urls(self, target: Target) -> list[str]:
        selector = f"{c.NAME_LABEL}={c.APP_NAME},{c.INSTANCE_LABEL}={target.name}"
        path = f"/api/v1/namespaces/{target.namespace}/pods"
        pods = self.kube.call("GET", path, query=[("labelSelector", selector)]).get("items")
        addresses = ready_pod_addresses(pods or [])
        return [f"http://{ip}:{c.SERVER_PORT}" for _, ip in sorted(addresses.items())]

    @staticmethod
    def _path(target: Target) -> str:
        return object_path(c.API_VERSION, c.KIND, target.namespace, target.name)


def meta_key(meta: dict[str, Any]) -> tuple[str, str]:
    return meta["namespace"], meta["name"]
