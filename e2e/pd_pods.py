"""The pods of a spec.prefill service run as processes: a prefill pod serving directly, and a
decode pod whose engine sits behind the llm-d router's routing sidecar.

kwok plays the kubelet, so each pod is moved to a loopback address of its own
(loopback_pod.py) and its containers run from the pod spec the operator wrote. The decode
pod's sidecar (its native-sidecar init container) runs the `pd-sidecar` binary built from
the Go module proxy with the EPP (e2e/cluster), under the sidecar's own ServiceAccount (a
kubeconfig with its token, so its Role is what SSRF protection reads the pool with). In a
pod the sidecar binds `:8000` on every address and calls its engine at `localhost:8200`;
here several pods share one host, so it binds a free port, forwarded from `<pod IP>:8000`,
and its `--model-server-port` is a free local port forwarded to `<pod IP>:8200`, where the
engine listens (pod_process.py binds the engine to the pod IP).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e import cluster as e2e_cluster
from e2e.cluster import build
from e2e.helpers import wait_for
from e2e.loopback_pod import is_ready, move_to_loopback
from e2e.pod_process import PodProcess
from e2e.ports import free_port
from octavo_bench.port_forward import PortForward

ROLE_LABEL = "llm-d.ai/role"
SERVER_PORT = 8000
ENGINE_PORT = 8200


def role_pod(
    core: client.CoreV1Api,
    api_client: client.ApiClient,
    namespace: str,
    instance: str,
    role: str,
    workdir: Path,
) -> PodProcess:
    """The service's one pod labelled llm-d.ai/role ROLE, Ready by kwok, on loopback."""
    selector = f"app.kubernetes.io/instance={instance},{ROLE_LABEL}={role}"

    def ready() -> list:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        pods = [p for p in pods if not p.metadata.deletion_timestamp]
        return pods if len(pods) == 1 and is_ready(pods[0]) else []

    (pod,) = wait_for(ready, timeout=90, what=f"the {role} pod, Ready by kwok")
    return move_to_loopback(core, api_client, namespace, pod, workdir)


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    """ARGS with `FLAG=value` set to VALUE (the sidecar's flags are written that way)."""
    if not any(a.startswith(f"{flag}=") for a in args):
        raise AssertionError(f"{flag} is not among the sidecar's args: {args}")
    return [f"{flag}={value}" if a.startswith(f"{flag}=") else a for a in args]


@dataclass
class RoutingSidecar:
    """The decode pod's routing sidecar, as its init container says, reachable at
    `<pod IP>:8000` like the sidecar of a real pod."""

    cluster: e2e_cluster.Cluster
    pod: dict[str, Any]  # the decode Pod (camelCase dict), moved to its loopback IP
    workdir: Path
    proc: subprocess.Popen | None = None
    forwards: list[PortForward] = field(default_factory=list)

    @property
    def container(self) -> dict[str, Any]:
        (sidecar,) = self.pod["spec"]["initContainers"]
        return sidecar

    @property
    def pod_ip(self) -> str:
        return self.pod["status"]["podIP"]

    def argv(self, listen: int, engine: int) -> list[str]:
        args = replace_flag(list(self.container["args"]), "--port", str(listen))
        args = replace_flag(args, "--model-server-port", str(engine))
        return [str(build.ensure_built(("epp",))["pd-sidecar"]), *args]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        listen, engine = free_port(), free_port()
        kubeconfig = e2e_cluster.service_account_kubeconfig(
            self.cluster,
            self.pod["metadata"]["namespace"],
            self.pod["spec"]["serviceAccountName"],
            self.workdir / "sidecar.kubeconfig",
        )
        env = {"PATH": os.environ["PATH"], "HOME": str(self.workdir), "KUBECONFIG": str(kubeconfig)}
        log = (self.workdir / "sidecar.log").open("w")
        self.proc = subprocess.Popen(
            self.argv(listen, engine), env=env, stdout=log, stderr=subprocess.STDOUT
        )
        self.forwards = [
            PortForward((self.pod_ip, SERVER_PORT), ("127.0.0.1", listen)).start(),
            PortForward(("127.0.0.1", engine), (self.pod_ip, ENGINE_PORT)).start(),
        ]
        deadline = time.monotonic() + 60
        while not _listening("127.0.0.1", listen):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the routing sidecar is not up:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "sidecar.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for forward in self.forwards:
            forward.stop()
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
