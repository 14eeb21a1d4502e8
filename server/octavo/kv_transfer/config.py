"""``--kv-transfer-config`` in vLLM's spelling (its ``KVTransferConfig``), parsed and checked.

Only ``"kv_connector": "NixlConnector"`` is accepted: the contract the llm-d routing sidecar
speaks. The blocks move over our own TCP side channel (``side_channel``), on CPU and GPU
alike; a NIXL transport is not built. Fields, as vLLM names them:

- ``kv_connector`` (required): ``"NixlConnector"``; any other name is an error naming it.
- ``kv_role``: ``kv_producer``, ``kv_consumer`` or ``kv_both`` (required, as in vLLM; like
  vLLM's NixlConnector every engine both serves and pulls blocks whatever it says).
- ``engine_id``: this engine's identity, answered as ``remote_engine_id`` (default: a uuid4).
- ``kv_buffer_device``: ``cuda``, ``cpu`` or ``xpu`` (accepted; our transport stages on CPU).
- ``kv_load_failure_policy``: ``"recompute"`` (default: the decode engine prefills the
  prompt itself when the remote blocks are gone, so a restarted or scaled-down prefill
  pool costs latency, never an error) or ``"fail"`` (the request ends with an error; the
  default of current vLLM, which llm-d itself advises against while prefill pods scale
  down: set it for vLLM's behaviour).
- ``kv_connector_extra_config``: ``kv_lease_duration`` (seconds a prefill engine holds a
  finished prompt's blocks for its decode engine, default 30), and vLLM's NIXL keys
  (``backends``, ``enforce_handshake_compat``, ...), accepted and unused.
- vLLM's other fields (``kv_rank``, ``kv_parallel_size``, ``kv_ip``, ``kv_port``,
  ``kv_buffer_size``, ``kv_connector_module_path``, ``enable_permute_local_kv``) are
  accepted and unused.

The side channel listens where vLLM's does: ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (default
``localhost``) and ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (default 5600; 0 picks a free port).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field, fields
from typing import Any

from octavo.arg_types import json_object

CONNECTORS = ("NixlConnector",)
ROLES = ("kv_producer", "kv_consumer", "kv_both")
BUFFER_DEVICES = ("cuda", "cpu", "xpu")
FAILURE_POLICIES = ("recompute", "fail")
DEFAULT_LEASE_SECONDS = 30.0
SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
DEFAULT_SIDE_CHANNEL_HOST = "localhost"
DEFAULT_SIDE_CHANNEL_PORT = 5600


@dataclass
class KVTransferConfig:
    kv_connector: str | None = None
    kv_role: str | None = None
    engine_id: str | None = None  # None: a uuid4, set in __post_init__ (as vLLM)
    kv_buffer_device: str = "cuda"
    kv_load_failure_policy: str = "recompute"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_buffer_size: float = 1e9
    kv_rank: int | None = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_module_path: str | None = None
    enable_permute_local_kv: bool = False

    def __post_init__(self) -> None:
        if self.engine_id is None:
            self.engine_id = str(uuid.uuid4())
        self.check()

    @classmethod
    def parse(cls, raw: str | dict[str, Any] | KVTransferConfig) -> KVTransferConfig:
        """From the flag's JSON text or a dict; ValueError naming what it cannot take."""
        if isinstance(raw, KVTransferConfig):
            return raw
        values = json_object(raw, "kv_transfer_config")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"kv_transfer_config: unknown keys {unknown}; known: {known}")
        return cls(**values)

    def check(self) -> None:
        _expect(
            self.kv_connector in CONNECTORS,
            f"kv_connector {self.kv_connector!r} is not supported; supported: {list(CONNECTORS)}",
        )
        _expect(
            self.kv_role in ROLES, f"kv_role must be one of {list(ROLES)}, got {self.kv_role!r}"
        )
        _expect(
            isinstance(self.engine_id, str) and bool(self.engine_id),
            f"engine_id must be a non-empty string, got {self.engine_id!r}",
        )
        _expect(
            self.kv_buffer_device in BUFFER_DEVICES,
            f"kv_buffer_device must be one of {list(BUFFER_DEVICES)}, "
            f"got {self.kv_buffer_device!r}",
        )
        _expect(
            self.kv_load_failure_policy in FAILURE_POLICIES,
            f"kv_load_failure_policy must be one of {list(FAILURE_POLICIES)}, "
            f"got {self.kv_load_failure_policy!r}",
        )
        _expect(
            isinstance(self.kv_connector_extra_config, dict),
            "kv_connector_extra_config must be a JSON object",
        )
        self.lease_seconds  # noqa: B018  (checked here, read later)

    @property
    def lease_seconds(self) -> float:
        """``kv_connector_extra_config.kv_lease_duration``: seconds blocks are held unread."""
        value = self.kv_connector_extra_config.get("kv_lease_duration", DEFAULT_LEASE_SECONDS)
        _expect(
            isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
            f"kv_connector_extra_config.kv_lease_duration must be a positive number of "
            f"seconds, got {value!r}",
        )
        return float(value)

    @property
    def recomputes_on_failure(self) -> bool:
        return self.kv_load_failure_policy == "recompute"


@dataclass(frozen=True)
class SideChannelAddress:
    host: str
    port: int


def side_channel_address(environ: dict[str, str] | None = None) -> SideChannelAddress:
    """Where the side channel listens (and what ``remote_host``/``remote_port`` answer):
    vLLM's ``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT``, or their defaults."""
    env = os.environ if environ is None else environ
    host = env.get(SIDE_CHANNEL_HOST_ENV, DEFAULT_SIDE_CHANNEL_HOST) or DEFAULT_SIDE_CHANNEL_HOST
    text = env.get(SIDE_CHANNEL_PORT_ENV, str(DEFAULT_SIDE_CHANNEL_PORT))
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"{SIDE_CHANNEL_PORT_ENV} must be a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{SIDE_CHANNEL_PORT_ENV} must be in [0, 65535], got {port}")
    return SideChannelAddress(host, port)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"kv_transfer_config: {message}")
