"""The OpenAPI v3 schema of `InferenceService`: types, defaults and CEL rules.

This is the one source of the CRD: `python -m octavo_operator.generate` writes it into
`manifests/crds/` and the Helm chart, and a test keeps those copies equal to it.
Every rule the apiserver can check lives here, so a bad spec is refused at `kubectl apply`
with a readable message instead of surfacing later as a broken Deployment.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
MODEL_URI = (
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/\s][^\s]*)?"
    r"|file:///[^\s]+)$"
)
SERVED_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$"
PERCENT = r"^(100|[1-9]?[0-9])%$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$"
MAX_NAME_LENGTH = 50  # leaves room for child suffixes such as "-cache" in 63 characters


def integer(minimum: int | None = None, maximum: int | None = None, **extra: Any) -> Schema:
    out: Schema = {"type": "integer", "format": "int32", **extra}
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return out


def string(description: str, **extra: Any) -> Schema:
    return {"type": "string", "description": description, **extra}


def rule(expression: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"rule": expression, "message": message, **extra}


def obj(description: str, properties: dict[str, Schema], **extra: Any) -> Schema:
    """An object schema. `default={}` stands for "every field at its own default": the
    apiserver checks CEL rules against a default as written, before nested defaults."""
    if extra.get("default") == {}:
        extra["default"] = {k: v["default"] for k, v in properties.items() if "default" in v}
    return {"type": "object", "description": description, "properties": properties, **extra}


INT_OR_STRING: Schema = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
}


def int_or_percent(description: str, default: int | str | None = None) -> Schema:
    out: Schema = {
        **INT_OR_STRING,
        "pattern": PERCENT,
        "description": f"{description}: a count or a percentage such as 25%",
        "x-kubernetes-validations": [
            rule("type(self) != int || self >= 0", "must not be negative"),
        ],
    }
    if default is not None:
        out["default"] = default
    return out


def quantity(description: str) -> Schema:
    validations = [rule("type(self) != int || self > 0", "must be positive")]
    return {
        **INT_OR_STRING,
        "pattern": QUANTITY,
        "description": description,
        "x-kubernetes-validations": validations,
    }


def free_form(description: str, kind: str = "object") -> Schema:
    """Kubernetes types copied through unchanged (tolerations, affinity)."""
    if kind == "array":
        items = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "array", "description": description, "items": items}
    return {
        "type": "object",
        "description": description,
        "x-kubernetes-preserve-unknown-fields": True,
    }


def model_schema() -> Schema:
    return obj(
        "Which weights to serve. Without `uri`, the embedded SmolLM2-135M-Instruct.",
        {
            "uri": string(
                "hf://org/name, pvc://claim/path/in/claim or file:///path/in/image",
                pattern=MODEL_URI,
                maxLength=512,
            ),
            "servedName": string(
                "the name clients put in the `model` field (default: metadata.name)",
                pattern=SERVED_NAME,
            ),
            "revision": string(
                "a branch, tag or commit of an hf:// model",
                pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$",
            ),
        },
        default={},
        **{
            "x-kubernetes-validations": [
                rule(
                    "!has(self.revision) || (has(self.uri) && self.uri.startsWith('hf://'))",
                    "model.revision applies only to an hf:// model.uri",
                )
            ]
        },
    )


def resources_schema() -> Schema:
    return obj(
        "Compute per replica, or per pod of a replica with engine.nodes above 1. `gpu` "
        "defaults to engine.tensorParallelSize × engine.pipelineParallelSize / engine.nodes; "
        "0 runs on CPU (tensor/pipeline ranks too, as processes).",
        {
            "gpu": integer(0, 64, description="GPUs per replica (per pod with engine.nodes > 1)"),
            "gpuResourceName": string(
                "the extended resource that counts GPUs",
                default="nvidia.com/gpu",
                pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$",
            ),
            "cpu": quantity("CPU request and limit, e.g. 4 or 500m"),
            "memory": quantity("memory request and limit, e.g. 16Gi"),
        },
        default={},
    )


def cache_schema() -> Schema:
    return obj(
        "A volume for downloaded and converted weights, mounted at /cache. Either an "
        "existing claim, or a size (and storageClassName) for a claim the operator creates.",
        {
            "claimName": string("an existing PersistentVolumeClaim", pattern=DNS_LABEL),
            "size": quantity("size of the claim the operator creates, e.g. 40Gi"),
            "storageClassName": string("storage class of that claim"),
            "accessMode": string(
                "access mode of that claim",
                enum=["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"],
                default="ReadWriteOnce",
            ),
        },
        **{
            "x-kubernetes-validations": [
                rule(
                    "has(self.claimName) != has(self.size)",
                    "cache needs exactly one of claimName (existing claim) or size (new claim)",
                ),
                rule(
                    "!has(self.storageClassName) || has(self.size)",
                    "cache.storageClassName applies only to a claim the operator creates (size)",
                ),
            ]
        },
    )


def autoscaling_schema() -> Schema:
    return obj(
        "Autoscale through the InferenceService's /scale with a HorizontalPodAutoscaler on "
        "a per-pod metric (served by prometheus-adapter as vllm_num_requests_waiting or "
        "vllm_kv_cache_usage_perc). minReplicas 0 scales to zero: after "
        "scaleToZeroAfterSeconds with no request running or waiting the operator sets "
        "replicas to 0, and the operator's activator holds the next request while it starts "
        "a pod.",
        {
            "minReplicas": integer(0, 1000, default=1),
            "scaleToZeroAfterSeconds": integer(
                10,
                86400,
                default=300,
                description="with minReplicas 0: the idle period "
                "(no request running or waiting on any pod) before scaling to zero",
            ),
            "maxReplicas": integer(1, 1000),
            "metric": string(
                "the per-pod metric to track",
                enum=["requestsWaiting", "kvCacheUsage"],
                default="requestsWaiting",
            ),
            "target": {
                "type": "number",
                "description": "average per pod: waiting requests, or KV usage in (0, 1]",
                "default": 5,
            },
        },
        required=["maxReplicas"],
        **{
            "x-kubernetes-validations": [
                rule(
                    "self.maxReplicas >= self.minReplicas",
                    "autoscaling.maxReplicas must be >= autoscaling.minReplicas",
                ),
                rule("self.target > 0.0", "autoscaling.target must be positive"),
                rule(
                    "self.metric != 'kvCacheUsage' || self.target <= 1.0",
                    "autoscaling.target for kvCacheUsage is a fraction in (0, 1]",
                ),
            ]
        },
    )


def rollout_schema() -> Schema:
    return obj(
        "How a spec change replaces pods. The default never asks for an extra GPU: "
        "maxSurge 0, maxUnavailable 1.",
        {
            "strategy": string(
                "RollingUpdate or Recreate",
                enum=["RollingUpdate", "Recreate"],
                default="RollingUpdate",
            ),
            "maxSurge": int_or_percent("extra pods during a rolling update", 0),
            "maxUnavailable": int_or_percent("pods that may be down during a rolling update", 1),
        },
        default={},
        **{
            "x-kubernetes-validations": [
                rule(
                    "self.strategy == 'Recreate' || !(string(self.maxSurge) in ['0', '0%'] && "
                    "string(self.maxUnavailable) in ['0', '0%'])",
                    "rollout.maxSurge and rollout.maxUnavailable must not both be zero",
                )
            ]
        },
    )


def drain_schema() -> Schema:
    return obj(
        "Graceful shutdown: the pod leaves the Service endpoints, waits preStopSeconds, then "
        "the server finishes in-flight requests until the grace period ends.",
        {
            "preStopSeconds": integer(0, 3600, default=10),
            "terminationGracePeriodSeconds": integer(1, 86400, default=60),
        },
        default={},
        **{
            "x-kubernetes-validations": [
                rule(
                    "self.terminationGracePeriodSeconds > self.preStopSeconds",
                    "drain.terminationGracePeriodSeconds must exceed drain.preStopSeconds",
                )
            ]
        },
    )


def adapters_schema() -> Schema:
    """`spec.adapters`: LoRA adapters served on the base model, changed without restarts."""
    adapter = obj(
        "A LoRA adapter in PEFT's format (adapter_config.json + safetensors).",
        {
            "name": string(
                "the name clients put in the `model` field to use this adapter",
                pattern=SERVED_NAME,
            ),
            "uri": string(
                "hf://org/name, pvc://claim/path/in/claim or file:///path/in/image",
                pattern=MODEL_URI,
                maxLength=512,
            ),
        },
        required=["name", "uri"],
    )
    return {
        "type": "array",
        "description": (
            "LoRA adapters every replica serves (turns on --enable-lora, even when empty). "
            "A new pod loads them before it reports Ready; a change is loaded into and "
            "unloaded from the ready pods through their API, without restarting them (an "
            "adapter on a pvc:// claim not yet mounted rolls the pods once to mount it). "
            "status.conditions AdaptersReady says where each adapter stands."
        ),
        "maxItems": 256,
        "items": adapter,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
    }
