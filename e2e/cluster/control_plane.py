"""Start, check and stop the test control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and a kwok controller playing two fake GPU nodes, all on 127.0.0.1.

State of a running cluster lives in `paths.state_dir()`: `state.json` (pids, ports), `pki/`,
`kubeconfigs/`, `admin.kubeconfig`, `bin/` (links to every built binary), `logs/<component>.log`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..ports import free_ports
from . import build, pki, versions
from .build import log
from .paths import HERE, state_dir
from .rest import ApiError, Credentials, Rest, insecure_context, probe, wait_until

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
NODE_NAMES = ("kwok-node-0", "kwok-node-1")
# What each fake node advertises (capacity == allocatable). Room for 1000 pods each (a
# kubelet's default is 110): the operator benchmark runs 500 services on the two.
NODE_RESOURCES = {
    "cpu": "32",
    "memory": "256Gi",
    "pods": "1000",
    "ephemeral-storage": "1Ti",
    "nvidia.com/gpu": "8",
}
NODE_LABEL_SELECTOR = "type=kwok"
SERVICE_CIDR = "10.96.0.0/16"  # virtual: never routed, only allocated by the apiserver
POD_CIDR = "10.244.0.0/16"  # fake pod IPs that kwok writes into pod status
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
STOP_GRACE_S = 10.0


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Cluster:
    """What a test or a person needs to use a running cluster."""

    state_dir: Path
    server: str
    kubeconfig: Path
    ca_file: Path
    bin_dir: Path
    logs_dir: Path

    def env(self) -> dict[str, str]:
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def export_lines(self) -> str:
        return f'export KUBECONFIG="{self.kubeconfig}"\nexport PATH="{self.bin_dir}:$PATH"\n'

    def admin(self) -> Rest:
        pki_dir = self.state_dir / "pki"
        return Rest(
            Credentials(self.server, self.ca_file, pki_dir / "admin.crt", pki_dir / "admin.key")
        )

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    def log_files(self) -> dict[str, Path]:
        return {c: self.logs_dir / f"{c}.log" for c in COMPONENTS}


# --------------------------------------------------------------------------- processes


def _proc_start_time(pid: int) -> int | None:
    """Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie is not running
        return None
    return int(fields[19])


def _alive(entry: dict[str, Any]) -> bool:
    return _proc_start_time(entry["pid"]) == entry["start_time"]


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _stop_pid(pid: int, start_time: int | None, name: str) -> None:
    """SIGTERM the process group of PID, then SIGKILL after STOP_GRACE_S; only if PID is still
    the process we started (same start time)."""
    if start_time is not None and _proc_start_time(pid) != start_time:
        _reap(pid)
        return
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            _reap(pid)
            if _proc_start_time(pid) is None:
                return
            time.sleep(0.1)
    if _proc_start_time(pid) is not None:
        raise ClusterError(f"{name} (pid {pid}) did not exit after SIGKILL")


def _orphans(sdir: Path) -> list[int]:
    """Processes whose command line names this state folder, started by an earlier `up` whose
    state file is gone (every component's arguments carry a path inside it)."""
    found = []
    needle = str(sdir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = Path(argv[0].decode(errors="replace")).name if argv else ""
        if name in COMPONENTS and any(needle in a for a in argv[1:]):
            found.append(int(entry.name))
    return found


# --------------------------------------------------------------------------- state


class _State:
    def __init__(self, sdir: Path):
        self.dir = sdir
        self.file = sdir / "state.json"

    def load(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.file.read_text())
        except (OSError, ValueError):
            return None

    def save(self, data: dict[str, Any]) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.file)


@contextlib.contextmanager
def _locked(sdir: Path) -> Iterator[None]:
    sdir.mkdir(parents=True, exist_ok=True)
    with (sdir / ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _cluster_from(sdir: Path, data: dict[str, Any]) -> Cluster:
    return Cluster(
        state_dir=sdir,
        server=data["server"],
        kubeconfig=sdir / "admin.kubeconfig",
        ca_file=sdir / "pki" / "ca.crt",
        bin_dir=sdir / "bin",
        logs_dir=sdir / "logs",
    )


def _healthy(sdir: Path, data: dict[str, Any]) -> bool:
    procs = data.get("processes", {})
    if set(procs) != set(COMPONENTS) or not all(_alive(p) for p in procs.values()):
        return False
    cluster = _cluster_from(sdir, data)
    try:
        status, _ = cluster.admin().request("GET", "/readyz", ok=(200,))
    except (OSError, ApiError):
        return False
    return status == 200


# --------------------------------------------------------------------------- files


def kubeconfig_text(
    server: str,
    ca_file: Path,
    user: str,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> str:
    """A kubeconfig (YAML; every value JSON-quoted, which YAML reads as-is)."""
    q = json.dumps
    creds = (
        f"    token: {q(token)}\n"
        if token is not None
        else f"    client-certificate: {q(str(cert))}\n    client-key: {q(str(key))}\n"
    )
    ns = f"    namespace: {q(namespace)}\n" if namespace else ""
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: octavo-e2e\n  cluster:\n    server: {q(server)}\n"
        f"    certificate-authority: {q(str(ca_file))}\n"
        f"users:\n- name: {q(user)}\n  user:\n{creds}"
        f"contexts:\n- name: {q(user)}\n  context:\n    cluster: octavo-e2e\n"
        f"    user: {q(user)}\n{ns}"
        f"current-context: {q(user)}\n"
    )


def _write_pki_and_kubeconfigs(sdir: Path, server: str) -> None:
    pdir = sdir / "pki"
    ca = pki.make_ca(pdir)
    pki.issue(
        ca,
        pdir,
        "apiserver",
        "kube-apiserver",
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", "10.96.0.1"),
    )
    pki.service_account_keys(pdir)
    # The aggregation layer's front proxy: its own CA, and the client the apiserver presents.
    front_ca = pki.make_ca(pdir, "front-proxy-ca")
    pki.issue(front_ca, pdir, "front-proxy-client", "front-proxy-client")
    users = {
        # file name: (common name, organizations)
        "admin": ("octavo-e2e-admin", ("system:masters",)),
        "kube-controller-manager": ("system:kube-controller-manager", ()),
        "kube-scheduler": ("system:kube-scheduler", ()),
        "kwok": ("octavo-e2e-kwok", ("system:masters",)),
    }
    kdir = sdir / "kubeconfigs"
    kdir.mkdir()
    for name, (cn, orgs) in users.items():
        pair = pki.issue(ca, pdir, name, cn, organizations=orgs)
        text = kubeconfig_text(server, ca.cert, cn, cert=pair.cert, key=pair.key)
        (kdir / f"{name}.kubeconfig").write_text(text)
    shutil.copy(kdir / "admin.kubeconfig", sdir / "admin.kubeconfig")


def _link_binaries(sdir: Path, binaries: dict[str, Path]) -> None:
    bdir = sdir / "bin"
    bdir.mkdir()
    for name, path in binaries.items():
        (bdir / name).symlink_to(path)


# --------------------------------------------------------------------------- commands


def _commands(sdir: Path, ports: dict[str, int]) -> dict[str, list[str]]:
    p, k, b = sdir / "pki", sdir / "kubeconfigs", sdir / "bin"
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"

    def component(name: str, port: int) -> list[str]:
        kubeconfig = str(k / f"{name}.kubeconfig")
        return [
            str(b / name),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={p / name}",
            "--leader-elect=false",
            "--v=1",
        ]

    return {
        "etcd": [
            str(b / "etcd"),
            "--name=octavo-e2e",
            f"--data-dir={sdir / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=octavo-e2e={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # throw-away test data: do not wait on the disk
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(b / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # Endpoints may not be loopback addresses: leave the `kubernetes` Service without
            # endpoints instead of failing to write them every few seconds.
            "--endpoint-reconciler-type=none",
            f"--secure-port={ports['kube-apiserver']}",
            f"--cert-dir={p / 'kube-apiserver'}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ],
        "kube-controller-manager": [
            *component("kube-controller-manager", ports["kube-controller-manager"]),
            # Every default controller (deployment, replicaset, garbagecollector,
            # serviceaccount, serviceaccount-token, namespace, nodelifecycle, ...).
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
        ],
        "kube-scheduler": component("kube-scheduler", ports["kube-scheduler"]),
        "kwok": [
            str(b / "kwok"),
            f"--config={sdir / 'kwok.yaml'}",
            f"--kubeconfig={k / 'kwok.kubeconfig'}",
            f"--manage-nodes-with-label-selector={NODE_LABEL_SELECTOR}",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=40",
        ],
    }


def _node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {
            "capacity": dict(NODE_RESOURCES),
            "allocatable": dict(NODE_RESOURCES),
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


# --------------------------------------------------------------------------- up / down


def tail_log(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class _Starter:
    def __init__(self, sdir: Path, state: _State, data: dict[str, Any]):
        self.sdir, self.state, self.data = sdir, state, data
        self.popen: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        logfile = self.sdir / "logs" / f"{name}.log"
        with logfile.open("ab") as fh:
            proc = subprocess.Popen(
                argv,
                cwd=self.sdir,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        self.popen[name] = proc
        start_time = None
        for _ in range(50):
            start_time = _proc_start_time(proc.pid)
            if start_time is not None or proc.poll() is not None:
                break
            time.sleep(0.01)
        self.data["processes"][name] = {"pid": proc.pid, "start_time": start_time, "argv": argv}
        self.state.save(self.data)

    def check_running(self) -> None:
        for name, proc in self.popen.items():
            if proc.poll() is not None:
                log_file = self.sdir / "logs" / f"{name}.log"
                raise ClusterError(
                    f"{name} exited with code {proc.returncode}; last lines of {log_file}:\n"
                    + tail_log(log_file)
                )


def status() -> Cluster | None:
    """The running cluster of this checkout, or None when it is not (fully) up."""
    sdir = state_dir()
    data = _State(sdir).load()
    if data and _healthy(sdir, data):
        return _cluster_from(sdir, data)
    return None


def describe() -> dict[str, Any]:
    sdir = state_dir()
    data = _State(sdir).load() or {}
    procs = {
        name: {"pid": p["pid"], "running": _alive(p)}
        for name, p in (data.get("processes") or {}).items()
    }
    return {
        "state_dir": str(sdir),
        "server": data.get("server"),
        "healthy": bool(data) and _healthy(sdir, data),
        "processes": procs,
        "versions": data.get("versions"),
    }


def up(timeout: float | None = None) -> Cluster:
    """Bring the cluster up (or return the one already running). Idempotent."""
    timeout = float(timeout or os.environ.get("OCTAVO_E2E_UP_TIMEOUT", "180"))
    sdir = state_dir()
    with _locked(sdir):
        state = _State(sdir)
        data = state.load()
        if data and _healthy(sdir, data):
            return _cluster_from(sdir, data)
        _down_locked(sdir, quiet=True)
        binaries = build.ensure_built()
        started = time.monotonic()
        try:
            cluster = _start(sdir, state, binaries, timeout)
        except BaseException:
            log(f"`up` failed; stopping what was started (logs stay in {sdir / 'logs'})")
            _down_locked(sdir, quiet=True)
            raise
        log(f"cluster up in {time.monotonic() - started:.1f} s: {cluster.server}")
        return cluster


def _start(sdir: Path, state: _State, binaries: dict[str, Path], timeout: float) -> Cluster:
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    for child in sdir.iterdir():
        if child.name == ".lock":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    (sdir / "logs").mkdir()
    names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    server = f"https://127.0.0.1:{ports['kube-apiserver']}"
    data: dict[str, Any] = {
        "server": server,
        "ports": ports,
        "processes": {},
        "versions": versions.summary(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    state.save(data)
    _write_pki_and_kubeconfigs(sdir, server)
    _link_binaries(sdir, binaries)
    shutil.copy(HERE / "kwok.yaml", sdir / "kwok.yaml")
    cmds = _commands(sdir, ports)
    starter = _Starter(sdir, state, data)
    cluster = _cluster_from(sdir, data)

    starter.start("etcd", cmds["etcd"])
    wait_until(
        lambda: probe(f"http://127.0.0.1:{ports['etcd']}/health")[0] == 200,
        left(),
        "etcd /health",
        on_poll=starter.check_running,
    )
    starter.start("kube-apiserver", cmds["kube-apiserver"])
    admin = cluster.admin()
    admin.timeout = 5.0
    wait_until(
        lambda: admin.request("GET", "/readyz", ok=(200,))[0] == 200,
        left(),
        "kube-apiserver /readyz",
        interval=0.5,
        on_poll=starter.check_running,
    )
    starter.start("kube-controller-manager", cmds["kube-controller-manager"])
    starter.start("kube-scheduler", cmds["kube-scheduler"])
    # kwok reads ~/.kwok/kwok.yaml when it exists: give it a HOME of its own.
    kwok_home = sdir / "kwok-home"
    kwok_home.mkdir()
    starter.start("kwok", cmds["kwok"], env={**os.environ, "HOME": str(kwok_home)})
    for name in NODE_NAMES:
        admin.post("/api/v1/nodes", _node(name))

    insecure = insecure_context()
    for name in ("kube-controller-manager", "kube-scheduler"):
        url = f"https://127.0.0.1:{ports[name]}/healthz"
        wait_until(
            lambda url=url: probe(url, insecure)[0] == 200,
            left(),
            f"{name} /healthz",
            on_poll=starter.check_running,
        )

    def nodes_ready() -> bool:
        items = admin.get(f"/api/v1/nodes?labelSelector={NODE_LABEL_SELECTOR}")["items"]
        ready = {
            n["metadata"]["name"]
            for n in items
            for c in (n.get("status") or {}).get("conditions") or []
            if c["type"] == "Ready" and c["status"] == "True"
        }
        return ready >= set(NODE_NAMES)

    wait_until(nodes_ready, left(), "the kwok nodes to be Ready", on_poll=starter.check_running)
    # The serviceaccount controller creates `default` in every namespace; pods need it.
    wait_until(
        lambda: admin.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0],
        left(),
        "the default ServiceAccount",
        on_poll=starter.check_running,
    )
    return cluster


def down(quiet: bool = False) -> bool:
    """Stop every component of this checkout's cluster. True if something was running."""
    sdir = state_dir()
    if not sdir.exists():
        return False
    with _locked(sdir):
        return _down_locked(sdir, quiet=quiet)


def _down_locked(sdir: Path, quiet: bool) -> bool:
    state = _State(sdir)
    data = state.load() or {}
    stopped = False
    procs = data.get("processes") or {}
    for name in reversed(COMPONENTS):
        entry = procs.get(name)
        if entry and entry.get("start_time") is not None and _alive(entry):
            _stop_pid(entry["pid"], entry["start_time"], name)
            stopped = True
    for pid in _orphans(sdir):
        _stop_pid(pid, _proc_start_time(pid), f"orphan pid {pid}")
        stopped = True
    state.file.unlink(missing_ok=True)
    for name in ("etcd-data", "pki", "kubeconfigs", "admin.kubeconfig", "kwok-home", "bin"):
        path = sdir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if stopped and not quiet:
        log(f"cluster stopped (logs kept in {sdir / 'logs'})")
    return stopped
