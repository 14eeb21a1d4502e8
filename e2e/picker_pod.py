"""The operator's endpoint-picker pod (spec.router) run as real processes.

kwok plays the kubelet, so nothing runs the picker pod's containers; this does, from the
Deployment the operator wrote: the `epp` container's args with the llm-d router's EPP
binary (built from the Go module proxy by e2e/cluster, like the control plane), under the
picker's own ServiceAccount (a kubeconfig with its token, so its Role is what is tested),
and the `tokenizer` sidecar's command (`octavo launch render ...`). Containers of a pod
share one network namespace; here they share 127.0.0.1, each container port mapped to a
free one: the EPP's config (the operator's ConfigMap) has its token producer's
`http://localhost:8000` rewritten to the sidecar's port, and its gRPC ports are flags.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e import cluster as e2e_cluster
from e2e.cluster import build
from e2e.ports import free_port
from octavo_bench.port_forward import PortForward

METRICS_PORT = 9090  # the picker container's metrics port (the operator scrapes it)
PORT_FLAGS = ("--grpc-port", "--grpc-health-port", "--metrics-port")


def container(template: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in template["spec"]["containers"] if c["name"] == name)


def replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    """ARGS with FLAG's value set to VALUE (`--flag value` form), added if absent."""
    if flag in args:
        out = list(args)
        out[out.index(flag) + 1] = value
        return out
    return [*args, flag, value]


def rewritten_config(text: str, render_url: str) -> str:
    """The EndpointPickerConfig with the token producer pointed at the sidecar's port."""
    config = yaml.safe_load(text)
    for plugin in config.get("plugins") or []:
        vllm = (plugin.get("parameters") or {}).get("vllm")
        if plugin.get("type") == "token-producer" and vllm is not None:
            vllm["url"] = render_url
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class PickerPod:
    cluster: e2e_cluster.Cluster
    deployment: dict[str, Any]  # the picker Deployment (camelCase dict)
    config_text: str  # the ConfigMap's EndpointPickerConfig
    workdir: Path
    # The picker pod's loopback IP (e2e/loopback_pod.py), if the test moved it: its metrics
    # port is then forwarded there, where the operator reads it (scale from zero).
    pod_ip: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)
    forwards: list[PortForward] = field(default_factory=list)

    @property
    def template(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]

    @property
    def ext_proc_address(self) -> str:
        return f"127.0.0.1:{self.ports['--grpc-port']}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        render_port = self._start_render()
        self._start_epp(f"http://127.0.0.1:{render_port}")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = (self.workdir / f"{name}.log").open("w")
        self.procs.append(
            subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def _start_render(self) -> int:
        sidecar = container(self.template, "tokenizer")
        port = free_port()
        args = replace_flag(list(sidecar["args"]), "--port", str(port))
        args = replace_flag(args, "--host", "127.0.0.1")
        binary = Path(sys.executable).parent / sidecar["command"][0]  # installed in this venv
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.workdir),
            "LANG": "C.UTF-8",
            "OCTAVO_CACHE": str(self.workdir / "cache"),
            "HF_HUB_OFFLINE": "1",
        }
        self._spawn("tokenizer", [str(binary), *sidecar["command"][1:], *args], env)
        self._wait(lambda: _http_ok(f"http://127.0.0.1:{port}/health"), "the tokenizer sidecar")
        return port

    def _start_epp(self, render_url: str) -> None:
        epp = container(self.template, "epp")
        config = self.workdir / "epp-config.yaml"
        config.write_text(rewritten_config(self.config_text, render_url))
        args = replace_flag(list(epp["args"]), "--config-file", str(config))
        for flag in PORT_FLAGS:
            self.ports[flag] = free_port()
            args = replace_flag(args, flag, str(self.ports[flag]))
        meta = self.deployment["metadata"]
        kubeconfig = e2e_cluster.service_account_kubeconfig(
            self.cluster,
            meta["namespace"],
            self.template["spec"]["serviceAccountName"],
            self.workdir / "picker.kubeconfig",
        )
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.workdir),
            "KUBECONFIG": str(kubeconfig),
            "NAMESPACE": meta["namespace"],
            "POD_NAME": f"{meta['name']}-e2e",
        }
        binary = build.ensure_built(("epp",))["epp"]
        self._spawn("epp", [str(binary), *args], env)
        grpc_port = self.ports["--grpc-port"]
        self._wait(lambda: _listening(grpc_port), "the endpoint picker's ext_proc port")
        if self.pod_ip:
            metrics = (self.pod_ip, METRICS_PORT), ("127.0.0.1", self.ports["--metrics-port"])
            self.forwards.append(PortForward(*metrics).start())

    def _wait(self, check, what: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise AssertionError(f"{what}: a picker pod process exited:\n{self.logs()}")
            if check():
                return
            time.sleep(0.5)
        raise AssertionError(f"{what} was not up in {timeout:.0f} s:\n{self.logs()}")

    def logs(self, lines: int = 40) -> str:
        out = []
        for path in sorted(self.workdir.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self) -> None:
        for forward in self.forwards:
            forward.stop()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)  # the EPP drains for 30 s on SIGTERM: nothing to keep
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False
