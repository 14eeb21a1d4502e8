"""The LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, kubernetes-sigs/lws v0.9.0) that runs
a replica across engine.nodes hosts: one group of pods per replica, created, restarted and
scaled together. The leader serves the API and drives every rank; the workers run
`octavo serve ... --headless` (their ranks only, no HTTP).

Every field the LWS CRD or its mutating webhook would default is written here, so the object
the operator applies is the object the apiserver stores and nothing reads as an edit.
"""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .container import resources, security_context, server_args, server_container, server_env
from .deployment import pod_annotations, pod_spec_with
from .metadata import labels, metadata
from .node_key import node_key_env
from .volumes import volume_mounts

# LWS puts these in every container's env; the kubelet expands $(NAME) in args.
GROUP_SIZE = ["--nnodes", "$(LWS_GROUP_SIZE)"]
LEADER_ADDRESS = ["--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", str(c.MASTER_PORT)]
LEADER_ARGS = [*GROUP_SIZE, "--node-rank", "0", *LEADER_ADDRESS]
WORKER_ARGS = [*GROUP_SIZE, "--node-rank", "$(LWS_WORKER_INDEX)", *LEADER_ADDRESS, "--headless"]
API_KEY_ENV = "OCTAVO_API_KEY"  # spec.apiKeySecretRef, on the leader only
# A worker pod's restart recreates its whole group: the ranks of one world die together.
RESTART_POLICY = "RecreateGroupOnPodRestart"
# The workers' StatefulSet is made once the leader pod exists, not once it is Ready: the
# leader only becomes Ready after every worker joined, so LeaderReady would never start.
STARTUP_POLICY = "LeaderCreated"


def leader_container(isvc: InferenceService, image: str) -> dict[str, Any]:
    """The server container of a plain replica (API, probes, drain), as node 0 of N."""
    container = server_container(isvc, image)
    container["args"] = server_args(isvc, LEADER_ARGS)
    container["env"] = [*container["env"], node_key_env(isvc)]
    return container


def worker_container(isvc: InferenceService, image: str) -> dict[str, Any]:
    """A headless node: the same image and flags, no port and no probe. It has no HTTP to
    probe, and needs no liveness check of its own: it exits (non-zero) when the leader
    goes away or one of its ranks dies, and the leader exits when a worker host stops
    answering; either restart recreates the group (RESTART_POLICY). A hung collective
    is the leader's to detect, through its own liveness probe."""
    return {
        "name": c.CONTAINER_NAME,
        "image": image,
        "command": ["octavo"],
        "args": server_args(isvc, WORKER_ARGS),
        "env": [*worker_env(isvc), node_key_env(isvc)],
        "resources": resources(isvc),
        "securityContext": security_context(),
        "volumeMounts": volume_mounts(isvc),
    }


def worker_env(isvc: InferenceService) -> list[dict[str, Any]]:
    """The server's environment less the API key: a worker answers no request."""
    return [e for e in server_env(isvc) if e["name"] != API_KEY_ENV]


def rollout_strategy(isvc: InferenceService) -> dict[str, Any]:
    """spec.rollout in groups; Recreate (which LWS lacks) takes every group down at once."""
    if isvc.rollout.strategy == "Recreate":
        surge, unavailable = 0, "100%"
    else:
        surge, unavailable = isvc.rollout.max_surge, isvc.rollout.max_unavailable
    config = {"partition": 0, "maxUnavailable": unavailable, "maxSurge": surge}
    return {"type": "RollingUpdate", "rollingUpdateConfiguration": config}


def group_template(isvc: InferenceService, image: str) -> dict[str, Any]:
    leader = {
        "metadata": {"labels": labels(isvc), "annotations": pod_annotations()},
        "spec": pod_spec_with(isvc, leader_container(isvc, image)),
    }
    worker = {
        "metadata": {"labels": labels(isvc, c.WORKER_COMPONENT)},
        "spec": pod_spec_with(isvc, worker_container(isvc, image)),
    }
    return {
        "size": isvc.engine.nodes,
        "restartPolicy": RESTART_POLICY,
        "leaderTemplate": leader,
        "workerTemplate": worker,
    }


def leader_worker_set(isvc: InferenceService, image: str) -> dict[str, Any]:
    return {
        "apiVersion": c.LWS_API,
        "kind": c.LWS_KIND,
        "metadata": metadata(isvc, isvc.group_name),
        "spec": {
            "replicas": isvc.desired_replicas,
            "startupPolicy": STARTUP_POLICY,
            "rolloutStrategy": rollout_strategy(isvc),
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": group_template(isvc, image),
        },
    }
