"""Which InferenceService a request reaching the activator was meant for.

The activator receives the traffic of every service at zero (through their EndpointSlices),
so it reads the target from the Host header the client sent: the service's DNS name,
``NAME.NAMESPACE.svc.cluster.local[:port]`` (the status url), ``NAME.NAMESPACE.svc`` or
``NAME.NAMESPACE``. A bare ``NAME`` (a client in the service's own namespace) is resolved
with the namespace of the calling pod, found by its IP.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    namespace: str
    name: str


class UnknownTarget(ValueError):
    """The Host header names no service the activator can find."""


def target_from_host(host: str, caller_namespace: Callable[[], str | None]) -> Target:
    hostname = _without_port(host).rstrip(".").lower()
    if not hostname or _is_ip(hostname):
        raise UnknownTarget(
            f"Host {host!r} names no service: call the service's DNS name "
            "(NAME.NAMESPACE.svc), as in the InferenceService's status.url"
        )
    parts = hostname.split(".")
    if len(parts) >= 2 and (len(parts) == 2 or parts[2] == "svc"):
        return Target(namespace=parts[1], name=parts[0])
    if len(parts) == 1:
        namespace = caller_namespace()
        if namespace is None:
            raise UnknownTarget(
                f"Host {host!r} is a bare name and the caller's namespace is "
                "unknown: call NAME.NAMESPACE.svc"
            )
        return Target(namespace=namespace, name=parts[0])
    raise UnknownTarget(f"Host {host!r} is not a service's name (NAME.NAMESPACE.svc)")


def _without_port(host: str) -> str:
    if host.startswith("["):  # [IPv6]:port
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
