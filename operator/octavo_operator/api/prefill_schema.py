"""The schema of `spec.prefill` and the spec-level rules that tie it to the rest."""

from __future__ import annotations

import copy
from typing import Any

from octavo_operator import constants as c

from .engine_schema import (
    EXTRA_ARGS,
    MULTI_NODE_FLAGS,
    OPERATOR_FLAGS,
    extra_args_rule,
    sets_flag_rule,
)
from .prefill import FAILURE_POLICIES, KV_TRANSFER_FLAG, MAX_LEASE_SECONDS
from .schema import Schema, free_form, integer, obj, quantity, rule, string

PREFILL_GUARDED = (*OPERATOR_FLAGS, *MULTI_NODE_FLAGS, KV_TRANSFER_FLAG)


def prefill_resources_schema() -> Schema:
    return obj(
        "Compute per prefill replica; a field left out takes spec.resources' value.",
        {
            "gpu": integer(0, 64, description="GPUs per prefill replica"),
            "gpuResourceName": string(
                "the extended resource that counts GPUs", pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$"
            ),
            "cpu": quantity("CPU request and limit, e.g. 4 or 500m"),
            "memory": quantity("memory request and limit, e.g. 16Gi"),
        },
    )


def sidecar_schema() -> Schema:
    return obj(
        "The llm-d router's P/D routing sidecar in each decode pod: it takes the requests on "
        f"port {c.SERVER_PORT}, sends the prompt to the prefill pod the picker chose, then "
        f"the request with the prefill's KV transfer parameters to its engine (port "
        f"{c.DECODE_ENGINE_PORT}).",
        {
            "image": string(
                f"the sidecar image (default: the operator's, {c.DEFAULT_SIDECAR_IMAGE})",
                pattern=r"^[^\s]+$",
                maxLength=512,
            ),
            "resources": free_form("sidecar resources (core/v1 ResourceRequirements)"),
        },
    )


def kv_transfer_schema() -> Schema:
    return obj(
        f"How the decode engines take the prefill engines' KV blocks: both pools' "
        f"{KV_TRANSFER_FLAG}.",
        {
            "failurePolicy": string(
                "when a decode engine cannot fetch a prompt's KV blocks: recompute the prompt "
                "itself (recompute) or fail the request (fail)",
                enum=list(FAILURE_POLICIES),
                default="recompute",
            ),
            "leaseSeconds": integer(
                1,
                MAX_LEASE_SECONDS,
                description="seconds a prefill engine holds a prompt's KV blocks for a decode "
                "engine that has not fetched them (kv_lease_duration); a fetch extends it",
                default=30,
            ),
        },
    )


def prefill_schema() -> Schema:
    extra_args = copy.deepcopy(EXTRA_ARGS)
    extra_args["description"] = (
        "more `octavo serve` flags for the prefill engines, after engine.extraArgs"
    )
    engine = obj(
        "Engine overrides of the prefill pool: spec.engine applies, then these flags.",
        {"extraArgs": extra_args},
        **{
            "x-kubernetes-validations": [
                rule(
                    extra_args_rule(PREFILL_GUARDED),
                    f"prefill.engine.extraArgs must not set {', '.join(PREFILL_GUARDED)}, nor "
                    "an abbreviation of one: the operator sets them",
                )
            ]
        },
    )
    return obj(
        "Prefill/decode disaggregation (KServe's LLMInferenceService spec.prefill): a second "
        f"Deployment <name>{c.PREFILL_SUFFIX} of prefill servers (label {c.ROLE_LABEL}: "
        f"{c.PREFILL_ROLE}) beside the decode servers of the rest of the spec ({c.ROLE_LABEL}: "
        f"{c.DECODE_ROLE}), both in the InferencePool. The endpoint picker sends each request "
        "to a decode pod and names a prefill pod; the decode pod's routing sidecar has the "
        "prefill pod compute the prompt, and its engine pulls the KV blocks (vLLM's "
        "NixlConnector contract) instead of recomputing them. Needs router.enabled.",
        {
            "replicas": integer(0, 1000, description="prefill replicas", default=1),
            "resources": prefill_resources_schema(),
            "engine": engine,
            "sidecar": sidecar_schema(),
            "kvTransfer": kv_transfer_schema(),
        },
    )


def prefill_rules() -> list[dict[str, Any]]:
    """Spec-level rules of spec.prefill."""
    kv = KV_TRANSFER_FLAG
    return [
        rule(
            "!has(self.prefill) || (has(self.router) && self.router.enabled)",
            "spec.prefill needs router.enabled: the endpoint picker splits each request "
            "between a prefill and a decode pod",
        ),
        rule(
            "!has(self.prefill) || self.engine.nodes <= 1",
            "spec.prefill needs engine.nodes 1 (a multi-node replica cannot be split)",
        ),
        rule(
            "!has(self.prefill) || !has(self.autoscaling) || self.autoscaling.minReplicas > 0",
            "spec.prefill does not scale to zero: autoscaling.minReplicas must be at least 1",
        ),
        rule(
            "!has(self.prefill) || !has(self.engine.extraArgs) || "
            f"self.engine.extraArgs.all(a, !({sets_flag_rule(repr(kv))}))",
            f"with spec.prefill the operator sets {kv} on both pools: engine.extraArgs must "
            "not set it",
        ),
    ]
