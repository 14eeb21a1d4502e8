"""An `InferenceService` parsed into dataclasses, with the schema's defaults applied again.

The apiserver applies the defaults, but the builders must not depend on that (objects
written before a default was added, unit tests), so each field falls back to the same value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from octavo_operator import constants as c

from .engine_fields import engine_settings


def section(spec: dict[str, Any], key: str) -> dict[str, Any]:
    return spec.get(key) or {}


@dataclass(frozen=True)
class ModelSource:
    uri: str | None = None
    served_name: str | None = None
    revision: str | None = None

    @property
    def scheme(self) -> str:
        """'hf', 'pvc', 'file', or 'embedded' when no uri is given."""
        return self.uri.split("://", 1)[0] if self.uri else "embedded"

    @property
    def claim_and_path(self) -> tuple[str, str]:
        """For pvc://claim/path: ('claim', 'path'); path may be ''."""
        claim, _, path = self.uri.removeprefix("pvc://").partition("/")  # type: ignore[union-attr]
        return claim, path.strip("/")

    @property
    def description(self) -> str:
        return self.uri or c.EMBEDDED_MODEL


@dataclass(frozen=True)
class Engine:
    """`spec.engine`: the value of every ENGINE_FIELDS entry by its camelCase name
    (defaults filled in), and the extra `octavo serve` arguments."""

    settings: Mapping[str, Any] = field(default_factory=lambda: engine_settings({}))
    extra_args: tuple[str, ...] = ()
    nodes: int = 1  # hosts one replica spans: above 1, a LeaderWorkerSet group

    @classmethod
    def from_spec(cls, engine_spec: dict[str, Any]) -> Engine:
        return cls(
            settings=engine_settings(engine_spec),
            extra_args=tuple(engine_spec.get("extraArgs") or ()),
            nodes=int(engine_spec.get("nodes") or 1),
        )

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.settings["tensorParallelSize"])

    @property
    def pipeline_parallel_size(self) -> int:
        return int(self.settings["pipelineParallelSize"] or 1)

    @property
    def world_size(self) -> int:
        """Worker processes (and GPUs) of one replica: tensor × pipeline ranks."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def ranks_per_node(self) -> int:
        """Worker processes (and GPUs) of one pod: the world split evenly over the nodes."""
        return max(1, self.world_size // self.nodes)


@dataclass(frozen=True)
class Resources:
    gpu: int
    gpu_resource_name: str = c.DEFAULT_GPU_RESOURCE
    cpu: str | None = None
    memory: str | None = None


@dataclass(frozen=True)
class Cache:
    claim_name: str | None = None
    size: str | None = None
    storage_class_name: str | None = None
    access_mode: str = "ReadWriteOnce"


@dataclass(frozen=True)
class Autoscaling:
    min_replicas: int
    max_replicas: int
    metric: str = "requestsWaiting"
    target: float = 5.0
    scale_to_zero_after_seconds: int = 300

    @property
    def to_zero(self) -> bool:
        """minReplicas 0: idle for scale_to_zero_after_seconds -> no pods; the activator
        brings one back for the next request."""
        return self.min_replicas == 0


@dataclass(frozen=True)
class Rollout:
    strategy: str = "RollingUpdate"
    max_surge: int | str = 0
    max_unavailable: int | str = 1


@dataclass(frozen=True)
class Drain:
    pre_stop_seconds: int = 10
    termination_grace_period_seconds: int = 60


@dataclass(frozen=True)
class DisruptionBudget:
    max_unavailable: int | str | None = None
    min_available: int | str | None = None


@dataclass(frozen=True)
class Monitoring:
    service_monitor: bool = False
    interval: str = "15s"


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = "api-key"


@dataclass(frozen=True)
class Scheduling:
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None


@dataclass(frozen=True)
class NetworkPolicy:
    """Ingress to the server port: from `allow_from` peers (empty: the pods of the
    namespace) and from `allow_scrape_from` peers (Prometheus)."""

    allow_from: tuple[dict[str, Any], ...] = ()
    allow_scrape_from: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter of `spec.adapters`: its served name and where it comes from."""

    name: str
    uri: str

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def claim_and_path(self) -> tuple[str, str]:
        claim, _, path = self.uri.removeprefix("pvc://").partition("/")
        return claim, path.strip("/")
