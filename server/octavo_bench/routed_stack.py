"""The processes of ``python -m octavo_bench routed``: model-server replicas, the endpoint
picker (the llm-d router's EPP, with file discovery instead of Kubernetes) and the gateway.

Each replica listens on a loopback address of its own (127.0.0.21, .22, ...) on the same
ports, as pods do, so the picker reaches each one's KV-event socket at `<ip>:5557`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from octavo_bench.port_forward import PortForward
from octavo_bench.serve_launch import (
    ChildServer,
    LaunchError,
    child_server,
    free_port,
    octavo_serve_command,
    stop,
)

SERVE_PORT = 8000
KV_EVENTS_PORT = 5557


@dataclass(frozen=True)
class StackOptions:
    model: str | None  # None: the embedded model
    served_name: str
    replicas: int
    log_dir: Path
    serve_flags: tuple[str, ...] = ()
    startup_timeout_s: float = 600.0


def replica_host(index: int) -> str:
    return f"127.0.0.{21 + index}"


def kv_events_flag(host: str, model: str, local_port: int) -> list[str]:
    """vLLM's --kv-events-config: ZMQ PUB bound on every address (here on LOCAL_PORT, which
    a forwarder serves at the replica's own <host>:5557), vLLM's topic."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{local_port}",
        "topic": f"kv@{host}@{model}",
    }
    return ["--kv-events-config", json.dumps(config)]


@contextlib.contextmanager
def replicas(options: StackOptions, kv_events: bool) -> Iterator[list[ChildServer]]:
    with contextlib.ExitStack() as stack:
        servers = []
        for index in range(options.replicas):
            host = replica_host(index)
            extra = ["--served-model-name", options.served_name, *options.serve_flags]
            if kv_events:
                local = free_port()
                forward = PortForward((host, KV_EVENTS_PORT), ("127.0.0.1", local)).start()
                stack.callback(forward.stop)
                extra += kv_events_flag(host, options.served_name, local)
            command = octavo_serve_command(SERVE_PORT, options.model, None, extra, host=host)
            log = options.log_dir / f"replica-{index}.log"
            server = child_server(
                f"replica {index}", command, SERVE_PORT, log, options.startup_timeout_s, host=host
            )
            servers.append(stack.enter_context(server))
        yield servers


def picker_config(endpoints_file: Path, served_name: str, render_url: str) -> dict:
    """The EPP's EndpointPickerConfig: file discovery, precise prefix cache from KV events
    (tokens from Octavo's /render), queue and KV-cache-use scorers."""
    plugins = [
        {
            "name": "endpoints",
            "type": "file-discovery",
            "parameters": {"path": str(endpoints_file), "watchFile": True},
        },
        {
            "type": "token-producer",
            "parameters": {"modelName": served_name, "vllm": {"url": render_url}},
        },
        {"type": "endpoint-notification-source"},
        {"type": "metrics-data-source"},
        {"type": "core-metrics-extractor"},
        {"type": "single-profile-handler"},
        {
            "type": "precise-prefix-cache-producer",
            "parameters": {
                "kvEventsConfig": {
                    "discoverPods": True,
                    "podDiscoveryConfig": {"socketPort": KV_EVENTS_PORT},
                }
            },
        },
        {
            "type": "prefix-cache-scorer",
            "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"},
        },
        {"type": "kv-cache-utilization-scorer"},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
    ]
    weights = {"prefix-cache-scorer": 3, "kv-cache-utilization-scorer": 1, "queue-scorer": 2}
    profile = [{"pluginRef": name, "weight": weight} for name, weight in weights.items()]
    return {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "dataLayer": {
            "discovery": {"pluginRef": "endpoints"},
            "sources": [
                {
                    "pluginRef": "metrics-data-source",
                    "extractors": [{"pluginRef": "core-metrics-extractor"}],
                },
                {
                    "pluginRef": "endpoint-notification-source",
                    "extractors": [{"pluginRef": "precise-prefix-cache-producer"}],
                },
            ],
        },
        "schedulingProfiles": [
            {"name": "default", "plugins": [*profile, {"pluginRef": "max-score-picker"}]}
        ],
    }


def endpoints_file(path: Path, servers: Sequence[ChildServer]) -> Path:
    entries = [
        {"name": f"replica-{i}", "address": s.host, "port": str(s.port)}
        for i, s in enumerate(servers)
    ]
    path.write_text(yaml.safe_dump({"endpoints": entries}))
    return path


def wait_for_port(host: str, port: int, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LaunchError(f"the endpoint picker exited with code {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.3)
    raise LaunchError(f"the endpoint picker did not listen on {host}:{port} in {timeout_s} s")


@contextlib.contextmanager
def endpoint_picker(binary: Path, config: dict, log_dir: Path) -> Iterator[str]:
    """The EPP as a process; yields its ext_proc address (plaintext gRPC)."""
    config_path = log_dir / "epp-config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    command = [
        str(binary),
        "--config-file",
        str(config_path),
        "--pool-name",
        "bench",
        "--pool-namespace",
        "default",
        "--secure-serving=false",
        "--grpc-port",
        str(grpc_port),
        "--grpc-health-port",
        str(health_port),
        "--metrics-port",
        str(metrics_port),
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--zap-encoder",
        "console",
    ]
    log_path = log_dir / "epp.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        server = ChildServer("endpoint picker", process, grpc_port, log_path)
        try:
            wait_for_port("127.0.0.1", grpc_port, process, 60)
            yield f"127.0.0.1:{grpc_port}"
        finally:
            stop(server)


@contextlib.contextmanager
def gateway(log_dir: Path, picker: str | None, servers: Sequence[ChildServer]):
    port = free_port()
    command = [sys.executable, "-m", "octavo_bench.gateway", "--port", str(port)]
    if picker:
        command += ["--picker", picker]
    else:
        command += ["--endpoints", ",".join(f"{s.host}:{s.port}" for s in servers)]
    name = "gateway (picker)" if picker else "gateway (round-robin)"
    with child_server(name, command, port, log_dir / "gateway.log", 60) as server:
        yield server


def counters(servers: Sequence[ChildServer], names: Sequence[str]) -> dict[str, list[float]]:
    """Each replica's value of each counter (summed over label sets)."""
    from octavo_bench.serve_server_stats import metric_values

    out: dict[str, list[float]] = {name: [] for name in names}
    for server in servers:
        values = metric_values(httpx.get(server.base_url + "/metrics", timeout=10).text)
        for name in names:
            out[name].append(values.get(name, 0.0))
    return out
