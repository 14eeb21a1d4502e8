"""The Secret that authenticates a multi-node replica's node channel (engine.nodes > 1).

The leader and its `--headless` workers read one random key as OCTAVO_NODE_KEY (the HMAC
key of the channel the workers dial, which carries pickles: an unauthenticated peer would
run code). One Secret per InferenceService, owned by it; created once and never rewritten
(node_key.ensure_node_key), so running groups keep the key they started with.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata

KEY_BYTES = 32


def node_key_secret(isvc: InferenceService) -> dict[str, Any]:
    """A new Secret with a fresh random key (create it only where none exists)."""
    key = secrets.token_hex(KEY_BYTES)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(isvc, isvc.node_key_secret_name),
        "type": "Opaque",
        "data": {c.NODE_KEY_FIELD: base64.b64encode(key.encode()).decode()},
    }


def node_key_env(isvc: InferenceService) -> dict[str, Any]:
    """OCTAVO_NODE_KEY from the Secret, for the leader's and the workers' container."""
    ref = {"name": isvc.node_key_secret_name, "key": c.NODE_KEY_FIELD}
    return {"name": c.NODE_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}
