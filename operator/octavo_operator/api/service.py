"""`InferenceService`: one parsed custom resource (metadata + spec)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo_operator import constants as c

from .prefill import Prefill, parse_prefill, prefill_problem
from .router import Router, parse_router
from .spec import (
    Adapter,
    Autoscaling,
    Cache,
    DisruptionBudget,
    Drain,
    Engine,
    ModelSource,
    Monitoring,
    NetworkPolicy,
    Resources,
    Rollout,
    Scheduling,
    SecretKeyRef,
    section,
)


@dataclass(frozen=True)
class InferenceService:
    name: str
    namespace: str
    uid: str
    generation: int
    model: ModelSource
    engine: Engine
    resources: Resources
    replicas: int | None = None
    image: str | None = None
    cache: Cache | None = None
    autoscaling: Autoscaling | None = None
    rollout: Rollout = field(default_factory=Rollout)
    drain: Drain = field(default_factory=Drain)
    startup_timeout_seconds: int = 1800
    disruption_budget: DisruptionBudget | None = None
    monitoring: Monitoring = field(default_factory=Monitoring)
    api_key: SecretKeyRef | None = None
    scheduling: Scheduling = field(default_factory=Scheduling)
    env: tuple[dict[str, Any], ...] = ()
    network_policy: NetworkPolicy | None = None
    adapters: tuple[Adapter, ...] | None = None  # None: LoRA off; () on without adapters
    router: Router | None = None  # None: spec.router off
    prefill: Prefill | None = None  # None: spec.prefill off (one pool serves everything)
    prefill_problem: str | None = None  # why spec.prefill cannot be honoured (see prefill.py)
    prefill_view: bool = False  # this copy describes the prefill pool (builders/prefill.py)

    @property
    def role(self) -> str | None:
        """The llm-d.ai/role of this copy's pods: None without a valid spec.prefill."""
        if not self.disaggregated:
            return None
        return c.PREFILL_ROLE if self.prefill_view else c.DECODE_ROLE

    @property
    def engine_port(self) -> int:
        """Where the engine listens: behind the routing sidecar in a decode pod."""
        return c.DECODE_ENGINE_PORT if self.role == c.DECODE_ROLE else c.SERVER_PORT

    @property
    def disaggregated(self) -> bool:
        """spec.prefill set and valid: a prefill pool beside the decode pool."""
        return self.prefill is not None and self.prefill_problem is None

    @property
    def prefill_name(self) -> str:
        """The prefill pool's Deployment (spec.prefill)."""
        return f"{self.name}{c.PREFILL_SUFFIX}"

    @property
    def sidecar_name(self) -> str:
        """The routing sidecar's ServiceAccount, Role and RoleBinding (spec.prefill)."""
        return f"{self.name}{c.SIDECAR_SUFFIX}"

    @property
    def claims(self) -> list[tuple[str, str]]:
        """(field, claim) for every existing PersistentVolumeClaim the pods mount: the
        model's, the cache's when named, and each pvc:// adapter's."""
        named = []
        if self.model.scheme == "pvc":
            named.append(("model.uri", self.model.claim_and_path[0]))
        if self.cache is not None and self.cache.claim_name:
            named.append(("cache.claimName", self.cache.claim_name))
        for adapter in self.adapters or ():
            if adapter.scheme == "pvc":
                named.append((f"adapters[{adapter.name}].uri", adapter.claim_and_path[0]))
        return named

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.name

    @property
    def picker_name(self) -> str:
        """The name of the endpoint picker's objects (spec.router)."""
        return f"{self.name}{c.PICKER_SUFFIX}"

    @property
    def group_name(self) -> str:
        """The LeaderWorkerSet's name (engine.nodes > 1); the Service keeps the plain name."""
        return f"{self.name}{c.LWS_SUFFIX}"

    @property
    def node_key_secret_name(self) -> str:
        """The Secret whose key authenticates the node channel (engine.nodes > 1)."""
        return f"{self.name}{c.NODE_KEY_SUFFIX}"

    @property
    def block_size(self) -> int:
        return int(self.engine.settings["blockSize"])

    @property
    def url(self) -> str:
        return f"http://{self.name}.{self.namespace}.svc.cluster.local:{c.SERVER_PORT}/v1"

    @property
    def scales_to_zero(self) -> bool:
        return self.autoscaling is not None and self.autoscaling.to_zero

    @property
    def desired_replicas(self) -> int:
        """What the Deployment gets: spec.replicas, kept inside the autoscaling range."""
        if self.autoscaling is None:
            return 1 if self.replicas is None else self.replicas
        wanted = self.autoscaling.min_replicas if self.replicas is None else self.replicas
        return max(self.autoscaling.min_replicas, min(self.autoscaling.max_replicas, wanted))

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> InferenceService:
        meta, spec = body["metadata"], body.get("spec") or {}
        engine = Engine.from_spec(section(spec, "engine"))
        resources = _resources(spec, engine)
        prefill = parse_prefill(spec, resources)
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 0)),
            model=_model(spec),
            engine=engine,
            resources=resources,
            replicas=spec.get("replicas"),
            image=spec.get("image"),
            cache=_optional(spec, "cache", _cache),
            autoscaling=_optional(spec, "autoscaling", _autoscaling),
            rollout=_rollout(spec),
            drain=_drain(spec),
            startup_timeout_seconds=section(spec, "startup").get("timeoutSeconds", 1800),
            disruption_budget=_optional(spec, "disruptionBudget", _disruption_budget),
            monitoring=_monitoring(spec),
            api_key=_optional(spec, "apiKeySecretRef", _secret_key_ref),
            scheduling=_scheduling(spec),
            env=tuple(spec.get("env") or ()),
            network_policy=_network_policy(spec),
            adapters=_adapters(spec),
            router=parse_router(spec),
            prefill=prefill,
            prefill_problem=prefill_problem(spec, prefill, engine.nodes),
        )


def _adapters(spec: dict[str, Any]) -> tuple[Adapter, ...] | None:
    if spec.get("adapters") is None:
        return None
    return tuple(Adapter(a["name"], a["uri"]) for a in spec["adapters"])


def _optional(spec: dict[str, Any], key: str, parse: Any) -> Any:
    return parse(spec[key]) if spec.get(key) is not None else None


def _model(spec: dict[str, Any]) -> ModelSource:
    m = section(spec, "model")
    return ModelSource(
        uri=m.get("uri"), served_name=m.get("servedName"), revision=m.get("revision")
    )


def _resources(spec: dict[str, Any], engine: Engine) -> Resources:
    r = section(spec, "resources")
    return Resources(
        gpu=r.get("gpu", engine.ranks_per_node),
        gpu_resource_name=r.get("gpuResourceName", c.DEFAULT_GPU_RESOURCE),
        cpu=None if r.get("cpu") is None else str(r["cpu"]),
        memory=None if r.get("memory") is None else str(r["memory"]),
    )


def _cache(c_: dict[str, Any]) -> Cache:
    return Cache(
        claim_name=c_.get("claimName"),
        size=None if c_.get("size") is None else str(c_["size"]),
        storage_class_name=c_.get("storageClassName"),
        access_mode=c_.get("accessMode", "ReadWriteOnce"),
    )


def _autoscaling(a: dict[str, Any]) -> Autoscaling:
    return Autoscaling(
        min_replicas=a.get("minReplicas", 1),
        max_replicas=a["maxReplicas"],
        metric=a.get("metric", "requestsWaiting"),
        target=float(a.get("target", 5)),
        scale_to_zero_after_seconds=a.get("scaleToZeroAfterSeconds", 300),
    )


def _rollout(spec: dict[str, Any]) -> Rollout:
    r = section(spec, "rollout")
    return Rollout(
        strategy=r.get("strategy", "RollingUpdate"),
        max_surge=r.get("maxSurge", 0),
        max_unavailable=r.get("maxUnavailable", 1),
    )


def _drain(spec: dict[str, Any]) -> Drain:
    d = section(spec, "drain")
    return Drain(
        pre_stop_seconds=d.get("preStopSeconds", 10),
        termination_grace_period_seconds=d.get("terminationGracePeriodSeconds", 60),
    )


def _disruption_budget(d: dict[str, Any]) -> DisruptionBudget:
    return DisruptionBudget(
        max_unavailable=d.get("maxUnavailable"), min_available=d.get("minAvailable")
    )


def _monitoring(spec: dict[str, Any]) -> Monitoring:
    m = section(spec, "monitoring")
    return Monitoring(
        service_monitor=m.get("serviceMonitor", False), interval=m.get("interval", "15s")
    )


def _secret_key_ref(s: dict[str, Any]) -> SecretKeyRef:
    return SecretKeyRef(name=s["name"], key=s.get("key", "api-key"))


def _scheduling(spec: dict[str, Any]) -> Scheduling:
    return Scheduling(
        node_selector=dict(spec.get("nodeSelector") or {}),
        tolerations=list(spec.get("tolerations") or []),
        affinity=spec.get("affinity"),
        priority_class_name=spec.get("priorityClassName"),
        runtime_class_name=spec.get("runtimeClassName"),
    )


def _network_policy(spec: dict[str, Any]) -> NetworkPolicy | None:
    n = section(spec, "networkPolicy")
    if not n.get("enabled", False):
        return None
    return NetworkPolicy(
        allow_from=tuple(n.get("allowFrom") or ()),
        allow_scrape_from=tuple(n.get("allowScrapeFrom") or ()),
    )
