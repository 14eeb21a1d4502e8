"""The `spec` of `InferenceService`, assembled from the field schemas, plus its CEL rules."""

from __future__ import annotations

from typing import Any

from .engine_schema import engine_schema
from .env_schema import env_schema
from .network_schema import network_policy_schema
from .prefill_schema import prefill_rules, prefill_schema
from .router_schema import router_rules, router_schema
from .schema import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    Schema,
    adapters_schema,
    autoscaling_schema,
    cache_schema,
    drain_schema,
    free_form,
    int_or_percent,
    integer,
    model_schema,
    obj,
    resources_schema,
    rollout_schema,
    rule,
    string,
)


def small_schemas() -> dict[str, Schema]:
    return {
        "startup": obj(
            "How long a replica may take to load its model before it is restarted.",
            {"timeoutSeconds": integer(10, 86400, default=1800)},
            default={},
        ),
        "disruptionBudget": obj(
            "A PodDisruptionBudget for voluntary evictions (node drains): exactly one field.",
            {
                "maxUnavailable": int_or_percent("pods a drain may take down at once"),
                "minAvailable": int_or_percent("pods a drain must leave running"),
            },
            **{
                "x-kubernetes-validations": [
                    rule(
                        "has(self.maxUnavailable) != has(self.minAvailable)",
                        "disruptionBudget needs exactly one of maxUnavailable or minAvailable",
                    )
                ]
            },
        ),
        "monitoring": obj(
            "Prometheus scraping. Pods always carry prometheus.io/* annotations.",
            {
                "serviceMonitor": {
                    "type": "boolean",
                    "description": "create a ServiceMonitor (needs the Prometheus Operator CRDs)",
                    "default": False,
                },
                "interval": string("scrape interval", pattern=r"^[0-9]+(ms|s|m)$", default="15s"),
            },
            default={},
        ),
        "apiKeySecretRef": obj(
            "A Secret key holding the API key clients must send as a Bearer token.",
            {
                "name": string("Secret name", pattern=DNS_SUBDOMAIN),
                "key": string("key in the Secret", default="api-key", pattern=r"^[-._a-zA-Z0-9]+$"),
            },
            required=["name"],
        ),
    }


def scheduling_schemas() -> dict[str, Schema]:
    return {
        "nodeSelector": {
            "type": "object",
            "description": "node labels the pods require",
            "additionalProperties": {"type": "string"},
        },
        "tolerations": free_form("pod tolerations (core/v1 Toleration)", "array"),
        "affinity": free_form("pod affinity (core/v1 Affinity)"),
        "priorityClassName": string("pod priority class", pattern=DNS_LABEL),
        "runtimeClassName": string("pod runtime class, e.g. nvidia", pattern=DNS_LABEL),
    }


def spec_rules() -> list[dict[str, Any]]:
    return [
        rule(  # on GPUs every rank needs its own (the server refuses fewer); CPU ranks share
            "!has(self.resources.gpu) || self.resources.gpu == 0 || self.engine.nodes > 1 || "
            "self.engine.tensorParallelSize * self.engine.pipelineParallelSize "
            "<= self.resources.gpu",
            "engine.tensorParallelSize × engine.pipelineParallelSize must not exceed "
            "resources.gpu (one GPU per rank; with resources.gpu 0 the ranks share the CPUs)",
        ),
        rule(  # across hosts every pod holds the same share of the ranks, one GPU each
            "!has(self.resources.gpu) || self.resources.gpu == 0 || self.engine.nodes == 1 || "
            "self.resources.gpu * self.engine.nodes == "
            "self.engine.tensorParallelSize * self.engine.pipelineParallelSize",
            "with engine.nodes above 1, resources.gpu is per node: resources.gpu × engine.nodes "
            "must equal engine.tensorParallelSize × engine.pipelineParallelSize (one GPU per "
            "rank)",
        ),
        rule(  # a group's pods run on different hosts: a claim each host can mount
            "self.engine.nodes <= 1 || !has(self.cache) || !has(self.cache.size) || "
            "self.cache.accessMode == 'ReadWriteMany'",
            "with engine.nodes above 1, a cache the operator creates (cache.size) needs "
            "cache.accessMode ReadWriteMany: the pods of a replica run on different nodes",
        ),
        rule(
            "!has(self.model.uri) || !self.model.uri.startsWith('pvc://') || "
            "!has(self.cache) || !has(self.cache.claimName) || "
            "self.model.uri.split('/')[2] != self.cache.claimName",
            "model.uri and cache must not use the same claim: the model claim is mounted read-only",
        ),
    ]


def spec_schema() -> Schema:
    properties: dict[str, Schema] = {
        "model": model_schema(),
        "image": string(
            "the server image (default: the operator's --default-image)",
            pattern=r"^[^\s]+$",
            maxLength=512,
        ),
        "replicas": integer(
            0,
            1000,
            description="replicas (default 1); with autoscaling, the autoscaler's: HPA/KEDA "
            "write it through /scale and the operator keeps the Deployment (the "
            "LeaderWorkerSet's groups with engine.nodes > 1) within [minReplicas, "
            "maxReplicas]. Leave it out of GitOps manifests when autoscaling",
            default=1,
        ),
        "engine": engine_schema(),
        "adapters": adapters_schema(),
        "resources": resources_schema(),
        "cache": cache_schema(),
        "autoscaling": autoscaling_schema(),
        "rollout": rollout_schema(),
        "drain": drain_schema(),
        **small_schemas(),
        **scheduling_schemas(),
        "env": env_schema(),
        "networkPolicy": network_policy_schema(),
        "router": router_schema(),
        "prefill": prefill_schema(),
    }
    return obj(
        "The desired serving deployment.",
        properties,
        default={},
        **{"x-kubernetes-validations": [*spec_rules(), *router_rules(), *prefill_rules()]},
    )
