"""Create a multi-node service's node key Secret once (builders/node_key.py says why).

Created, never applied: a server-side apply would write a new random key on every
reconcile, and the workers of a running group would then fail to authenticate to their
leader after a restart. An existing Secret is left exactly as it is.
"""

from __future__ import annotations

import logging

from kubernetes import client

from octavo_operator.api.service import InferenceService
from octavo_operator.builders.node_key import node_key_secret
from octavo_operator.kube import Kube, object_path

logger = logging.getLogger(__name__)


def ensure_node_key(kube: Kube, isvc: InferenceService) -> bool:
    """True when the Secret was created now; False when it already existed."""
    name = isvc.node_key_secret_name
    try:
        kube.call("GET", object_path("v1", "Secret", isvc.namespace, name))
        return False
    except client.ApiException as error:
        if error.status != 404:
            raise
    try:
        kube.create(node_key_secret(isvc))
    except client.ApiException as error:
        if error.status == 409:  # created meanwhile (another replica of the operator)
            return False
        raise
    logger.info("created Secret %s/%s (the node channel's key)", isvc.namespace, name)
    return True
