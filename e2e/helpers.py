"""Small helpers shared by the e2e tests: bounded waits and object builders."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

FAKE_IMAGE = "registry.invalid/octavo/fake:0"  # never pulled: kwok plays the kubelet


def wait_for(
    check: Callable[[], T],
    *,
    timeout: float = 60.0,
    interval: float = 0.2,
    what: str = "condition",
    describe: Callable[[], Any] | None = None,
) -> T:
    """Call CHECK until it returns something truthy and return that; fail after TIMEOUT s.
    Every INTERVAL s: most checks are one GET, and a wait ends on average INTERVAL/2 after
    what it waits for happened (the suite waits a few hundred times).

    The failure message carries CHECK's last value and, if given, DESCRIBE()'s output.
    """
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            extra = f"\nstate: {describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(interval)


def deployment(
    name: str,
    replicas: int,
    *,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Deployment whose single container asks for GPUS nvidia.com/gpu."""
    labels = labels or {"app": name}
    resources = {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": FAKE_IMAGE,
                            "resources": {"requests": resources, "limits": resources},
                        }
                    ],
                },
            },
        },
    }


def pod(name: str, *, gpus: int) -> dict[str, Any]:
    resources = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": FAKE_IMAGE,
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


def pod_is_ready(pod: Any) -> bool:
    conditions = pod.status.conditions or []
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in conditions
    )


@contextmanager
def persistent_volume_for(core, namespace: str, claim: str, size: str) -> Iterator[str]:
    """A hostPath PersistentVolume bound to CLAIM: the test cluster has no provisioner."""
    name = f"{namespace}-{claim}"[:63]
    body = {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": f"/tmp/{name}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    core.create_persistent_volume(body)
    try:
        yield name
    finally:
        core.delete_persistent_volume(name)
