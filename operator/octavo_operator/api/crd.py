"""The CustomResourceDefinition of `InferenceService`, built from the schema modules."""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c

from .schema import MAX_NAME_LENGTH, Schema, integer, obj, rule, string
from .spec_schema import spec_schema


def condition_schema() -> Schema:
    return obj(
        "A status condition (Ready, Progressing, Degraded; RouterReady, AdaptersReady, "
        "PrefillReady with the spec fields they follow).",
        {
            "type": string("condition type"),
            "status": string("True, False or Unknown", enum=["True", "False", "Unknown"]),
            "reason": string("CamelCase reason"),
            "message": string("human-readable detail"),
            "lastTransitionTime": string("when status last changed", format="date-time"),
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
        required=["type", "status"],
    )


def status_schema() -> Schema:
    conditions = {
        "type": "array",
        "items": condition_schema(),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    }
    return obj(
        "What the operator observed; written only by the operator.",
        {
            "observedGeneration": {"type": "integer", "format": "int64"},
            "replicas": integer(
                description="pods of the Deployment, or groups of the LeaderWorkerSet with "
                "engine.nodes > 1 (the /scale status)"
            ),
            "readyReplicas": integer(
                description="pods passing their readiness probe (groups whose pods all run "
                "and whose leader is ready)"
            ),
            "updatedReplicas": integer(description="pods (groups) running the current spec"),
            "selector": string(
                "label selector of the pods that serve the API, the groups' leaders with "
                "engine.nodes > 1 (the /scale selector)"
            ),
            "url": string("the OpenAI base URL inside the cluster"),
            "model": string("the model being served"),
            "router": obj(
                "spec.router: the InferencePool and its endpoint picker",
                {
                    "inferencePool": string("the InferencePool's name"),
                    "endpointPicker": string("the endpoint picker's Deployment and Service"),
                    "pickerReplicas": integer(description="picker replicas wanted"),
                    "pickerAvailableReplicas": integer(description="picker replicas available"),
                },
            ),
            "prefill": obj(
                "spec.prefill: the prefill pool",
                {
                    "deployment": string("the prefill pool's Deployment"),
                    "replicas": integer(description="prefill replicas wanted"),
                    "readyReplicas": integer(description="prefill replicas ready"),
                },
            ),
            "conditions": conditions,
        },
    )


def root_schema() -> Schema:
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            rule(
                f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && "
                "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                f"metadata.name must be a DNS label of at most {MAX_NAME_LENGTH} characters "
                "starting with a letter (it names the Service)",
            ),
            rule(
                f"self.spec.engine.nodes <= 1 || "
                f"self.metadata.name.size() <= {c.MAX_MULTI_NODE_NAME_LENGTH}",
                f"with spec.engine.nodes above 1, metadata.name must be at most "
                f"{c.MAX_MULTI_NODE_NAME_LENGTH} characters: it names the LeaderWorkerSet's "
                "StatefulSets, whose pods' revision labels must fit 63 characters",
            ),
        ],
    }


PRINTER_COLUMNS = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Model", "type": "string", "jsonPath": ".status.model"},
    {"name": "URL", "type": "string", "jsonPath": ".status.url"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def custom_resource_definition() -> dict[str, Any]:
    version = {
        "name": c.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": root_schema()},
        "subresources": {
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
        "additionalPrinterColumns": PRINTER_COLUMNS,
    }
    names = {
        "kind": c.KIND,
        "listKind": f"{c.KIND}List",
        "plural": c.PLURAL,
        "singular": c.SINGULAR,
        "shortNames": list(c.SHORT_NAMES),
        "categories": ["octavo"],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": c.CRD_NAME, "labels": {"app.kubernetes.io/part-of": "octavo"}},
        "spec": {"group": c.GROUP, "scope": "Namespaced", "names": names, "versions": [version]},
    }
