"""`spec.prefill` parsed: the prefill pool of a service split into prefill and decode pools.

KServe's LLMInferenceService shapes it: the top-level workload is the decode pool and
`prefill` adds a second one for prompt processing. Fields left out take the decode pool's
values (resources), so a minimal `prefill: {}` is one prefill replica like the decode ones.
The rules the apiserver cannot see (a spec written before the CRD had them) are checked
again here: `prefill_problem` says what is wrong, the status reports it as Degraded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .spec import Resources

KV_TRANSFER_FLAG = "--kv-transfer-config"  # the operator's on both pools with spec.prefill
FAILURE_POLICIES = ("recompute", "fail")  # the server's kv_load_failure_policy values
MAX_LEASE_SECONDS = 3600


@dataclass(frozen=True)
class KvTransfer:
    """spec.prefill.kvTransfer: what both pools' --kv-transfer-config carries.

    failure_policy: a decode engine whose KV fetch fails recomputes the prompt itself
    (recompute) or fails the request (fail). lease_seconds: how long a prefill engine holds
    a finished prompt's KV blocks for a decode engine that has not fetched them yet."""

    failure_policy: str = "recompute"
    lease_seconds: int = 30


@dataclass(frozen=True)
class RoutingSidecar:
    """The llm-d router's P/D routing sidecar in each decode pod."""

    image: str | None = None  # None: the operator's default sidecar image
    resources: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prefill:
    replicas: int
    resources: Resources
    extra_args: tuple[str, ...] = ()  # after spec.engine.extraArgs on the prefill engines
    sidecar: RoutingSidecar = field(default_factory=RoutingSidecar)
    kv_transfer: KvTransfer = field(default_factory=KvTransfer)


def parse_kv_transfer(p: dict[str, Any]) -> KvTransfer:
    kv = p.get("kvTransfer") or {}
    return KvTransfer(
        failure_policy=str(kv.get("failurePolicy", "recompute")),
        lease_seconds=int(kv.get("leaseSeconds", 30)),
    )


def parse_prefill(spec: dict[str, Any], decode_resources: Resources) -> Prefill | None:
    """None without spec.prefill."""
    p = spec.get("prefill")
    if p is None:
        return None
    r, s = p.get("resources") or {}, p.get("sidecar") or {}
    resources = Resources(
        gpu=r.get("gpu", decode_resources.gpu),
        gpu_resource_name=r.get("gpuResourceName", decode_resources.gpu_resource_name),
        cpu=str(r["cpu"]) if r.get("cpu") is not None else decode_resources.cpu,
        memory=str(r["memory"]) if r.get("memory") is not None else decode_resources.memory,
    )
    return Prefill(
        replicas=int(p.get("replicas", 1)),
        resources=resources,
        extra_args=tuple((p.get("engine") or {}).get("extraArgs") or ()),
        sidecar=RoutingSidecar(image=s.get("image"), resources=dict(s.get("resources") or {})),
        kv_transfer=parse_kv_transfer(p),
    )


def sets_flag(args: tuple[str, ...], flag: str) -> bool:
    """Whether ARGS set FLAG: as the CRD's rule (engine_schema.sets_flag_rule) reads them,
    spelled out, with a value, in underscores, or abbreviated (argparse expands unique
    prefixes)."""
    names = (a.split("=")[0].replace("_", "-") for a in args)
    return any(n.startswith(flag) or (n.startswith("--") and flag.startswith(n)) for n in names)


def prefill_problem(spec: dict[str, Any], prefill: Prefill | None, nodes: int) -> str | None:
    """Why spec.prefill cannot be honoured (the CRD's rules, checked again), or None."""
    if prefill is None:
        return None
    if not (spec.get("router") or {}).get("enabled", False):
        return "spec.prefill needs spec.router.enabled: the endpoint picker splits the requests"
    if nodes > 1:
        return "spec.prefill needs engine.nodes 1: a multi-node replica cannot be split"
    if ((spec.get("autoscaling") or {}).get("minReplicas", 1)) == 0:
        return "spec.prefill does not scale to zero: autoscaling.minReplicas must be at least 1"
    kv = prefill.kv_transfer
    if kv.failure_policy not in FAILURE_POLICIES:
        return f"prefill.kvTransfer.failurePolicy must be one of {', '.join(FAILURE_POLICIES)}"
    if not 1 <= kv.lease_seconds <= MAX_LEASE_SECONDS:
        return f"prefill.kvTransfer.leaseSeconds must be between 1 and {MAX_LEASE_SECONDS}"
    engine_args = tuple((spec.get("engine") or {}).get("extraArgs") or ())
    if sets_flag(engine_args, KV_TRANSFER_FLAG) or sets_flag(prefill.extra_args, KV_TRANSFER_FLAG):
        return (
            f"with spec.prefill the operator sets {KV_TRANSFER_FLAG} on both pools: "
            "engine.extraArgs and prefill.engine.extraArgs must not set it"
        )
    return None
