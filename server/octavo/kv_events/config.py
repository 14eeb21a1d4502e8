"""``kv_events_config`` in vLLM's spelling (its ``KVEventsConfig``), parsed and checked.

``{"enable_kv_cache_events": true}`` publishes the KV cache's events on a ZMQ PUB socket
bound to port 5557 of the server's ``--host`` (vLLM binds ``tcp://*:5557``: every
interface, whatever ``--host`` says) with an empty topic; every other key and default is
vLLM's:

- ``enable_kv_cache_events`` (false): nothing is recorded or published without it.
- ``publisher``: ``"zmq"`` or ``"null"`` (publish nothing); default ``"zmq"`` when events
  are enabled, else ``"null"``.
- ``endpoint`` (port 5557 of the server's ``--host``; without a server, as offline,
  vLLM's ``tcp://*:5557``): the PUB address; when named, bound if it holds ``*`` or
  ``::`` or is ``ipc://``/``inproc://``, else connected to (a subscriber that binds).
  ``tcp://*:PORT`` names every interface.
- ``replay_endpoint`` (none): a ROUTER address, always bound, where a subscriber asks for
  the batches it missed from a sequence number on.
- ``buffer_steps`` (10000): batches (one per engine step with events) kept for replay.
- ``hwm`` (100000): the PUB socket's high-water mark, past which a slow subscriber's
  messages are dropped.
- ``max_queue_size`` (100000): batches waiting for the publisher thread; a full queue
  makes the engine wait.
- ``topic`` (``""``): the first frame of every message (llm-d's router reads
  ``kv@<pod>@<model>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from octavo.arg_types import json_object

PUBLISHERS = ("null", "zmq")
ZMQ_TRANSPORTS = ("tcp://", "ipc://", "inproc://")
COUNTS = ("buffer_steps", "hwm", "max_queue_size")
DEFAULT_PORT = 5557
WILDCARD_HOSTS = ("", "0.0.0.0", "*")


@dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None  # resolved in __post_init__, as vLLM does
    endpoint: str | None = None  # None: DEFAULT_PORT on the server's --host (see above)
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    # Not a vLLM key: the API server's --host, where an unnamed endpoint binds.
    server_host: str | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        self.check()

    @property
    def publish_endpoint(self) -> str:
        """The PUB socket's address: the named ``endpoint``, else port 5557 of the server's
        host (every interface without one, as vLLM)."""
        if self.endpoint is not None:
            return self.endpoint
        return f"tcp://{zmq_host(self.server_host)}:{DEFAULT_PORT}"

    @property
    def publish_binds(self) -> bool:
        """Bind (an address of this host) or connect (a subscriber that binds)? vLLM's rule
        for a named endpoint; the server's host is always bound."""
        return self.endpoint is None or binds_by_vllms_rule(self.endpoint)

    @property
    def publishes(self) -> bool:
        """Are events recorded and sent? (vLLM: enabled, and a publisher other than null)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, raw: str | dict[str, Any] | KVEventsConfig) -> KVEventsConfig:
        """From the flag's JSON text or ``LLM(kv_events_config={...})``; ValueError on
        anything it cannot take, naming the key."""
        if isinstance(raw, KVEventsConfig):
            return raw
        values = json_object(raw, "kv_events_config")
        known = [f.name for f in fields(cls) if f.init]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"kv_events_config: unknown keys {unknown}; known: {known}")
        return cls(**values)

    def check(self) -> None:
        _expect(
            isinstance(self.enable_kv_cache_events, bool),
            "enable_kv_cache_events must be true or false",
        )
        _expect(
            self.publisher in PUBLISHERS,
            f"unknown publisher {self.publisher!r}; known: {list(PUBLISHERS)}",
        )
        if self.endpoint is not None:
            _check_endpoint("endpoint", self.endpoint)
        if self.replay_endpoint is not None:
            _check_endpoint("replay_endpoint", self.replay_endpoint)
        for name in COUNTS:
            value = getattr(self, name)
            _expect(
                _is_int(value) and value >= 0,
                f"{name} must be a non-negative integer, got {value!r}",
            )
        _expect(isinstance(self.topic, str), f"topic must be a string, got {self.topic!r}")


def zmq_host(host: str | None) -> str:
    """``--host`` as a ZMQ bind address: ``*`` for every interface, IPv6 in brackets."""
    if host is None or host in WILDCARD_HOSTS:
        return "*"
    return f"[{host.strip('[]')}]" if ":" in host else host


def binds_by_vllms_rule(endpoint: str) -> bool:
    """vLLM binds a wildcard address (``*``, ``::``) and ipc/inproc; it connects to others."""
    wildcard = "*" in endpoint or "::" in endpoint
    return wildcard or endpoint.startswith(("ipc://", "inproc://"))


def _check_endpoint(name: str, value: Any) -> None:
    _expect(
        isinstance(value, str) and value.startswith(ZMQ_TRANSPORTS),
        f"{name} must be a ZMQ address ({', '.join(ZMQ_TRANSPORTS)}...), got {value!r}",
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"kv_events_config: {message}")
