"""Kubernetes Events on an InferenceService, one per condition transition."""

from __future__ import annotations

import datetime as dt
import logging
import socket
from typing import Any

from kubernetes import client

from octavo_operator import constants as c
from octavo_operator.conditions import Condition
from octavo_operator.kube import Kube, api_error_message

logger = logging.getLogger(__name__)


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_object(owner: dict[str, Any], cond: Condition) -> dict[str, Any]:
    meta = owner["metadata"]
    now = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": "Normal" if cond.healthy else "Warning",
        "reason": cond.reason,
        "message": f"{cond.type}={cond.status_text}: {cond.message}"[:1024],
        "source": {"component": c.MANAGED_BY},
        "reportingComponent": c.MANAGED_BY,
        "reportingInstance": socket.gethostname()[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post_transitions(kube: Kube, owner: dict[str, Any], changed: list[Condition]) -> None:
    """Best effort: a failed Event is logged, never fails the reconcile."""
    for cond in changed:
        try:
            kube.create(event_object(owner, cond))
        except client.ApiException as error:
            logger.warning("could not post event %s: %s", cond.reason, api_error_message(error))
