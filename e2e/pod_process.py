"""Run a pod's container as a local process, the way a kubelet would minus the container.

There is no container runtime here, so the container's filesystem and network namespace
are emulated: every volume mount and image folder becomes a local folder (paths in env
values and arguments are rewritten to it), and the container port is mapped to a free
loopback port (the `--port` argument). Command, args, environment (the image's ENV from
the Dockerfile target, then the container's env, secretKeyRef values read from the
apiserver) and the probes' paths all come from the pod spec as the operator wrote it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.cluster.paths import REPO_ROOT
from e2e.ports import free_port
from octavo.cache_dirs import cache_root
from octavo_bench.port_forward import PortForward


def dockerfile_env(target: str, dockerfile: Path = REPO_ROOT / "Dockerfile") -> dict[str, str]:
    """ENV lines of one build stage (`FROM ... AS target`), continuation lines joined."""
    text = dockerfile.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    in_target = False
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if not words:
            continue
        if words[0].upper() == "FROM":
            in_target = line.strip().lower().endswith(f" as {target}")
        elif in_target and words[0].upper() == "ENV" and len(words) > 1:
            for pair in shlex.split(words[1]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


# The pods share one 2-core, 24 GiB test machine with each other and with the unit suite
# (a kubelet would give each its own node): each `octavo serve` gets 128 MiB of KV cache
# instead of the CPU default of 2 GiB, which it populates at start (three router pods held
# 6 GiB, and the machine ran out of memory beside the unit suite; the SmolLM2 example's
# 2,048-token context needs 95 MiB in fp32, the tiny models' far less); each records its CPU
# decode graphs at their first use, not all eight at start (as the unit suite's engines).
# The image's and the container's env still override both.
POD_MACHINE_ENV = {"OCTAVO_KV_CACHE_MEMORY": "128MiB", "OCTAVO_CPU_GRAPHS": "first-use"}
# A probe's wait ends on average half of this after the server is up (a GET is cheap).
PROBE_POLL_SECONDS = 0.25
WILDCARD_ENDPOINT = re.compile(r"tcp://\*:(\d+)")
VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class PodProcess:
    pod: dict[str, Any]  # the Pod as the apiserver returns it (camelCase dict)
    workdir: Path
    image_paths: dict[str, Path] = field(default_factory=dict)  # image folder -> local folder
    secrets: dict[tuple[str, str], str] = field(default_factory=dict)  # (secret, key) -> value
    config_maps: dict[tuple[str, str], str] = field(default_factory=dict)  # (map, key) -> value
    # A loopback address (127.x.y.z) standing in for the pod IP: the server listens there on
    # the container's own ports, so whoever reads status.podIP (the operator) reaches it.
    pod_ip: str | None = None
    # Env values that replace the container's own (and so its $(VAR) expansions): e.g. the
    # leader address LWS injects, a DNS name only the cluster's DNS resolves.
    env_overrides: dict[str, str] = field(default_factory=dict)
    # FLAG -> value replacing the argument after FLAG (or in FLAG=...), e.g. a free port for a
    # listener that binds every address, where two tests' pods would otherwise collide.
    arg_overrides: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    port_map: dict[int, int] = field(default_factory=dict)
    forwards: list[PortForward] = field(default_factory=list)

    @property
    def container(self) -> dict[str, Any]:
        return self.pod["spec"]["containers"][0]

    def path_map(self) -> dict[str, Path]:
        """Container path -> local folder: volume mounts and folders baked into the image.

        The tests make their models under Octavo's cache folder and name them by their host
        path, as a node-local folder the pod sees where it is: so that folder maps to itself,
        also when it lies under a path the pod mounts a volume at (its ``/tmp``, when the
        cache is under /tmp). A mount at the very same path still wins."""
        out = {str(cache_root()): cache_root()}
        for mount in self.container.get("volumeMounts") or []:
            local = self.workdir / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            out[mount["mountPath"]] = local
        return {**out, **self.image_paths}

    def rewrite(self, value: str) -> str:
        for container_path, local in sorted(self.path_map().items(), key=lambda kv: -len(kv[0])):
            if value == container_path or value.startswith(container_path.rstrip("/") + "/"):
                return str(local) + value[len(container_path.rstrip("/")) :]
        return value

    def environment(self, image_env: dict[str, str]) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **POD_MACHINE_ENV}
        env.update({k: self.rewrite(v) for k, v in image_env.items()})
        for var in self.container.get("env") or []:
            if "value" in var:
                env[var["name"]] = self.rewrite(var["value"])
            elif "fieldRef" in var["valueFrom"]:
                env[var["name"]] = self.downward_field(var["valueFrom"]["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in var["valueFrom"]:
                ref = var["valueFrom"]["configMapKeyRef"]
                env[var["name"]] = self.config_maps[(ref["name"], ref["key"])]
            else:
                ref = var["valueFrom"]["secretKeyRef"]
                env[var["name"]] = self.secrets[(ref["name"], ref["key"])]
        env.update(self.env_overrides)
        return env

    def _override(self, args: list[str]) -> list[str]:
        out = list(args)
        for flag, value in self.arg_overrides.items():
            if flag not in out and not any(a.startswith(f"{flag}=") for a in out):
                raise AssertionError(f"{flag} is not among the container's args: {args}")
            for i, arg in enumerate(out):
                if arg == flag:
                    out[i + 1] = value
                elif arg.startswith(f"{flag}="):
                    out[i] = f"{flag}={value}"
        return out

    def _forwarded(self, match: re.Match) -> str:
        """`tcp://*:PORT` (a ZMQ socket bound on every address of the pod, e.g. KV events)
        binds a free port here, forwarded from the pod's own IP:PORT (port_forward.py)."""
        own, local = int(match.group(1)), free_port()
        self.forwards.append(PortForward((self.pod_ip, own), ("127.0.0.1", local)))
        return f"tcp://*:{local}"

    def downward_field(self, path: str) -> str:
        """A downward-API field of the pod (the env's fieldRef)."""
        if path == "status.podIP":
            return self.pod_ip or "127.0.0.1"
        section, _, key = path.partition(".")
        return str(self.pod[section][key])

    def expand(self, value: str) -> str:
        """$(VAR) references to the container's env, expanded as the kubelet does."""
        env = self.environment({})
        return VAR_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), value)

    def argv(self) -> list[str]:
        """command + args, paths rewritten and container ports mapped to local ones."""
        args = [self.rewrite(self.expand(a)) for a in self.container.get("args") or []]
        args = self._override(args)
        if self.pod_ip:
            args = [WILDCARD_ENDPOINT.sub(self._forwarded, a) for a in args]
        for port in self.container.get("ports") or []:
            own = port["containerPort"]
            self.port_map[own] = own if self.pod_ip else free_port()
        if "--port" in args:  # a port no containerPort names (a headless node's) maps too
            i = args.index("--port") + 1
            own = int(args[i])
            args[i] = str(self.port_map.setdefault(own, own if self.pod_ip else free_port()))
        if self.pod_ip and "--host" in args:
            args[args.index("--host") + 1] = self.pod_ip
        command = list(self.container["command"])
        binary = Path(sys.executable).parent / command[0]  # installed in this venv
        return [str(binary), *command[1:], *args]

    def local_port(self, port: int | str) -> int:
        if isinstance(port, str):
            named = {p["name"]: p["containerPort"] for p in self.container.get("ports") or []}
            port = named[port]
        return self.port_map[port]

    def base_url(self, port: int | str) -> str:
        return f"http://{self.pod_ip or '127.0.0.1'}:{self.local_port(port)}"

    def start(self, image_env: dict[str, str]) -> None:
        command = self.argv()
        env = self.environment(image_env)
        log = (self.workdir / "pod.log").open("w")
        self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        for forward in self.forwards:
            forward.start()

    def probe(self, name: str) -> bool:
        """One HTTP GET of the probe named NAME (startupProbe, readinessProbe...)."""
        http = self.container[name]["httpGet"]
        url = f"{self.base_url(http['port'])}{http['path']}"
        try:
            with urllib.request.urlopen(url, timeout=self.container[name].get("timeoutSeconds", 1)):
                return True
        except OSError:
            return False

    def wait_probe(self, name: str, limit: float | None = None) -> float:
        """Poll like the kubelet (every periodSeconds, at most failureThreshold times, but
        at least every PROBE_POLL_SECONDS here); seconds until it passed."""
        spec = self.container[name]
        budget = limit or spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3)
        started = time.monotonic()
        while time.monotonic() - started < budget:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the pod's process exited:\n{self.log_tail()}")
            if self.probe(name):
                return time.monotonic() - started
            time.sleep(min(PROBE_POLL_SECONDS, spec.get("periodSeconds", 10)))
        raise AssertionError(f"{name} did not pass in {budget:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "pod.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def stop(self) -> int | None:
        for forward in self.forwards:
            forward.stop()
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def pod_dict(api: client.ApiClient, pod: Any) -> dict[str, Any]:
    return api.sanitize_for_serialization(pod)
