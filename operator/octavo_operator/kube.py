"""The few Kubernetes API calls the operator makes, over the `kubernetes` client's ApiClient.

Children are written with server-side apply under one field manager (`octavo-operator`),
forcing ownership of the fields it sets: a hand edit of one of those fields is put back by
the next apply, and an apply that changes nothing is not written (no new resourceVersion).

Why not `kubernetes.dynamic.DynamicClient`: its LazyDiscoverer answers a resource it does
not find (ServiceMonitors on a cluster without the Prometheus Operator, asked on every
reconcile) by rediscovering every API group and rewriting a cache file under /tmp, and it
has no lock while up to 128 handler threads would share it. The kinds the operator writes
are fixed, so a table of their plurals and one cached discovery answer do the job.
Events go through kopf (events.py), watches and retries are kopf's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client, config

from octavo_operator import constants as c

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "NetworkPolicy": "networkpolicies",
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
    "Event": "events",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Lease": "leases",
    "EndpointSlice": "endpointslices",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "InferencePool": "inferencepools",
    c.LWS_KIND: c.LWS_PLURAL,
    c.KIND: c.PLURAL,
}
DISCOVERY_TTL_SECONDS = 30.0
REQUEST_TIMEOUT = 30


class ApiUnanswered(client.ApiException):
    """The API server gave no answer: the request timed out or its connection broke.
    Status 0, never a permanent one: whoever retries an error status retries this too."""

    def __init__(self, method: str, path: str, error: Exception):
        message = f"the API server did not answer {method} {path}: {type(error).__name__}"
        super().__init__(status=0, reason=message)
        self.body = json.dumps({"message": message})


def api_error_message(error: client.ApiException) -> str:
    """The apiserver's own message (the Status object's), else the HTTP reason."""
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def error_text(error: client.ApiException) -> str:
    """'STATUS: message' for a status condition or a log line; the message alone without one."""
    message = api_error_message(error)
    return message if isinstance(error, ApiUnanswered) else f"{error.status}: {message}"


def load_api_client(kubeconfig: str | None = None, pool_size: int = 32) -> client.ApiClient:
    """A kubeconfig (argument or $KUBECONFIG or ~/.kube/config), else in-cluster. The
    connection pool is as large as kopf's worker pool, so no worker waits for a socket."""
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except config.ConfigException:
        if kubeconfig:
            raise
        config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def object_path(api_version: str, kind: str, namespace: str, name: str = "") -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


class NotLeading(client.ApiException):
    """A write refused before it was sent: this replica no longer holds the leader Lease
    (leader.py), so another may be writing."""

    def __init__(self) -> None:
        super().__init__(status=503, reason="this replica no longer holds the leader Lease")


def controller_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the object's controller (its ownerReference with controller: true)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)


def always() -> bool:
    return True


class Kube:
    def __init__(self, api: client.ApiClient, may_write: Callable[[], bool] = always):
        self.api = api
        self.may_write = may_write  # with leader election: Leadership.leads
        self._served: dict[str, tuple[float, bool]] = {}

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list | None = None,
        timeout: float = REQUEST_TIMEOUT,
        **headers: str,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer. Raises ApiException on a non-2xx status,
        NotLeading for a write once this replica has lost the leader Lease."""
        if method != "GET" and not self.may_write():
            raise NotLeading()
        header_params = {"Accept": "application/json", **headers}
        if body is not None:
            header_params.setdefault("Content-Type", "application/json")
        method, url, header_params, body, _ = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=header_params,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(
                method, url, header_params=header_params, body=body, _request_timeout=timeout
            )
            data = response.read()
        except urllib3.exceptions.HTTPError as error:  # a timeout, a refused or broken connection
            raise ApiUnanswered(method, path, error) from error
        if not 200 <= response.status < 300:
            raise client.ApiException(http_resp=response)
        return json.loads(data) if data else {}

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", c.FIELD_MANAGER), ("force", "true")]
        return self.call(
            "PATCH", path, obj, query, **{"Content-Type": "application/apply-patch+yaml"}
        )

    def delete(
        self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str | None = None
    ) -> bool:
        """True if something was deleted; a missing object is not an error. With OWNER_UID
        only an object that owner controls goes: a GET checks its controller reference, and
        the DELETE's precondition is the uid read (a namesake created meanwhile stays)."""
        path = object_path(api_version, kind, namespace, name)
        body = None
        try:
            if owner_uid is not None:
                found = self.call("GET", path)
                if controller_uid(found) != owner_uid:
                    return False
                body = {"preconditions": {"uid": found["metadata"]["uid"]}}
            self.call("DELETE", path, body)
        except client.ApiException as error:
            if error.status in (404, 409):  # gone, or replaced by a namesake meanwhile
                return False
            raise
        return True

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.call("PATCH", path, patch, **{"Content-Type": "application/merge-patch+json"})

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        return self.call("POST", path, obj)

    def namespace_terminating(self, namespace: str) -> bool:
        """Is the namespace being deleted (or gone)? The apiserver then refuses every
        create in it, Events included (403 NamespaceTerminating)."""
        try:
            found = self.call("GET", f"/api/v1/namespaces/{namespace}")
        except client.ApiException as error:
            return error.status == 404
        return (found.get("status") or {}).get("phase") == "Terminating"

    def forget_served(self) -> None:
        """Drop the cached discovery answers (a CRD was added or removed)."""
        self._served.clear()

    def served(self, group_version: str, plural: str) -> bool:
        """Does the apiserver serve this resource (e.g. ServiceMonitors)? Cached briefly."""
        key = f"{group_version}/{plural}"
        cached = self._served.get(key)
        if cached is not None and time.monotonic() - cached[0] < DISCOVERY_TTL_SECONDS:
            return cached[1]
        try:
            listing = self.call("GET", f"/apis/{group_version}")
            found = any(r.get("name") == plural for r in listing.get("resources", []))
        except client.ApiException as error:
            if error.status != 404:
                raise
            found = False
        self._served[key] = (time.monotonic(), found)
        return found
