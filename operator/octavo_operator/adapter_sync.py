"""Keep every ready pod serving exactly `spec.adapters`, and say where each one stands.

Runs on a timer per InferenceService with `spec.adapters` (and so within seconds of a
spec change): for each ready pod, unload what it serves but the spec no longer names (or
names from elsewhere), load what it lacks. A pod that starts later loads the list from
its ConfigMap before it reports Ready, so nothing here gates readiness. The outcome is
the `AdaptersReady` condition: True when every adapter is served by every ready pod.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService
from octavo_operator.builders.adapters import adapter_path
from octavo_operator.conditions import Condition
from octavo_operator.pod_adapters import PodAdapterAPI, PodUnreachable

ADAPTERS_READY = "AdaptersReady"
ApiFactory = Callable[[str], PodAdapterAPI]  # base URL -> client


@dataclass
class AdapterReport:
    ready_pods: list[str] = field(default_factory=list)
    loaded: dict[str, int] = field(default_factory=dict)  # adapter -> pods serving it
    failures: dict[str, dict[str, str]] = field(default_factory=dict)  # adapter -> pod -> why
    unreachable: dict[str, str] = field(default_factory=dict)  # pod -> why


def ready_pod_addresses(pods: list[dict[str, Any]]) -> dict[str, str]:
    """Pod name -> IP of the pods whose Ready condition is True, less the headless workers
    of multi-node groups (engine.nodes > 1): they serve no HTTP."""
    out = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(c.COMPONENT_LABEL) == c.WORKER_COMPONENT:
            continue
        status = pod.get("status") or {}
        ready = any(
            cond.get("type") == "Ready" and cond.get("status") == "True"
            for cond in status.get("conditions") or []
        )
        if ready and status.get("podIP"):
            out[(pod.get("metadata") or {}).get("name", "?")] = status["podIP"]
    return out


def sync_adapters(
    isvc: InferenceService, pods: list[dict[str, Any]], api_for: ApiFactory
) -> AdapterReport:
    wanted = {adapter.name: adapter_path(adapter) for adapter in isvc.adapters or ()}
    report = AdapterReport(loaded=dict.fromkeys(wanted, 0))
    for pod, ip in sorted(ready_pod_addresses(pods).items()):
        report.ready_pods.append(pod)
        try:
            _sync_pod(pod, api_for(f"http://{ip}:{c.SERVER_PORT}"), wanted, report)
        except PodUnreachable as error:
            report.unreachable[pod] = str(error)
        except ValueError as error:  # its adapter listing failed: no server of ours answers
            report.unreachable[pod] = f"listing its adapters failed: {error}"
    return report


def _sync_pod(pod: str, api: PodAdapterAPI, wanted: dict[str, str], report: AdapterReport) -> None:
    served = api.served()
    for name, path in served.items():
        if wanted.get(name) != path:
            with contextlib.suppress(ValueError):  # gone already (404): nothing to undo
                api.unload(name)
    for name, path in wanted.items():
        try:
            if served.get(name) != path:
                api.load(name, path)
        except ValueError as error:
            report.failures.setdefault(name, {})[pod] = str(error)
            continue
        report.loaded[name] += 1


def adapters_condition(report: AdapterReport | None) -> Condition:
    if report is None:
        return Condition(ADAPTERS_READY, False, "Pending", "adapters not yet loaded into pods")
    if not report.ready_pods:
        return Condition(
            ADAPTERS_READY,
            False,
            "NoReadyPods",
            "no ready pod: a starting pod loads the adapters itself",
        )
    total = len(report.ready_pods)
    parts = [_adapter_state(name, count, total, report) for name, count in report.loaded.items()]
    parts += [f"pod {pod} unreachable: {why}" for pod, why in report.unreachable.items()]
    if report.failures:
        return Condition(ADAPTERS_READY, False, "LoadFailed", "; ".join(parts))
    if report.unreachable or any(count < total for count in report.loaded.values()):
        return Condition(ADAPTERS_READY, False, "Loading", "; ".join(parts))
    message = f"{len(report.loaded)} adapters served by {total}/{total} ready pods"
    return Condition(ADAPTERS_READY, True, "Loaded", message if report.loaded else "no adapters")


def _adapter_state(name: str, count: int, total: int, report: AdapterReport) -> str:
    failed = report.failures.get(name, {})
    why = "".join(f", {pod}: {message}" for pod, message in failed.items())
    return f"{name}: {count}/{total} pods{why}"
