"""`spec.router` parsed, with the schema's defaults applied again (see spec.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo_operator import constants as c


@dataclass(frozen=True)
class Scorers:
    """Weights of the picker's scorers (0: left out of the scheduling profile)."""

    precise_prefix_cache: float = 3.0
    queue: float = 2.0
    kv_cache_utilization: float = 2.0
    lora_affinity: float = 1.0


@dataclass(frozen=True)
class Picker:
    image: str | None = None  # None: the operator's default picker image
    replicas: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    tokenizer_resources: dict[str, Any] = field(default_factory=dict)
    failure_mode: str = "FailOpen"
    secure_serving: bool = True


@dataclass(frozen=True)
class Router:
    picker: Picker = field(default_factory=Picker)
    scorers: Scorers = field(default_factory=Scorers)
    block_size: int | None = None  # None: the engine's block size
    kv_events_port: int = c.KV_EVENTS_PORT

    @property
    def replay_port(self) -> int:
        return self.kv_events_port + 1


def parse_router(spec: dict[str, Any]) -> Router | None:
    """None unless spec.router.enabled."""
    r = spec.get("router") or {}
    if not r.get("enabled", False):
        return None
    p, s = r.get("picker") or {}, r.get("scorers") or {}
    picker = Picker(
        image=p.get("image"),
        replicas=int(p.get("replicas", 1)),
        resources=dict(p.get("resources") or {}),
        tokenizer_resources=dict(p.get("tokenizerResources") or {}),
        failure_mode=p.get("failureMode", "FailOpen"),
        secure_serving=bool(p.get("secureServing", True)),
    )
    scorers = Scorers(
        precise_prefix_cache=float(s.get("precisePrefixCache", 3)),
        queue=float(s.get("queue", 2)),
        kv_cache_utilization=float(s.get("kvCacheUtilization", 2)),
        lora_affinity=float(s.get("loraAffinity", 1)),
    )
    return Router(
        picker=picker,
        scorers=scorers,
        block_size=r.get("blockSize"),
        kv_events_port=int(r.get("kvEventsPort", c.KV_EVENTS_PORT)),
    )
