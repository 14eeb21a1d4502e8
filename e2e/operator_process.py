"""Run the operator as a local process, acting as the ServiceAccount its RBAC is granted to.

`install_rbac` creates the CRD, the `octavo-system` namespace, the ServiceAccount and a
ClusterRole/ClusterRoleBinding whose rules are the operator's generated rule file (the same
file the Helm chart's ClusterRole renders). `OperatorProcess` starts `octavo-operator` with
a kubeconfig minted for that ServiceAccount, so every API call is checked by RBAC.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from e2e import cluster as e2e_cluster
from e2e.cluster.paths import REPO_ROOT
from e2e.helpers import wait_for
from e2e.ports import free_port

NAMESPACE = "octavo-e2e"
SERVICE_ACCOUNT = "octavo-operator-e2e"
CRD_FILE = REPO_ROOT / "manifests/crds/inferenceservices.octavo.dev.yaml"
RULES_FILE = REPO_ROOT / "charts/octavo/files/rbac/clusterrole-rules.yaml"
LEASE_RULES_FILE = REPO_ROOT / "charts/octavo/files/rbac/leader-election-rules.yaml"
ROLE_NAME = "octavo-operator-e2e"


def _apply(create: Any, *args: Any) -> None:
    try:
        create(*args)
    except client.ApiException as error:
        if error.status != 409:
            raise


def install_crd(apiext: client.ApiextensionsV1Api, crd_file: Path = CRD_FILE) -> None:
    """Create (or replace) the CRD in CRD_FILE and wait until it is established."""
    # libyaml's loader where PyYAML has it: LeaderWorkerSet's CRDs are 1.3-1.5 MB of YAML,
    # 3 s each to parse in pure Python.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(crd_file.read_text(), Loader=loader)
    try:
        apiext.create_custom_resource_definition(crd)
    except client.ApiException as error:
        if error.status != 409:
            raise
        current = apiext.read_custom_resource_definition(crd["metadata"]["name"])
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        apiext.replace_custom_resource_definition(crd["metadata"]["name"], crd)

    def established() -> bool:
        conds = apiext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions
        return any(c.type == "Established" and c.status == "True" for c in conds or [])

    wait_for(established, timeout=30, what=f"{crd['metadata']['name']} to be established")


def install_rbac(api: client.ApiClient) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    _apply(core.create_namespace, {"metadata": {"name": NAMESPACE}})
    _apply(
        core.create_namespaced_service_account, NAMESPACE, {"metadata": {"name": SERVICE_ACCOUNT}}
    )
    rules = yaml.safe_load(RULES_FILE.read_text())
    role = {"metadata": {"name": ROLE_NAME}, "rules": rules}
    _apply(rbac.create_cluster_role, role)
    rbac.replace_cluster_role(ROLE_NAME, role)
    binding = {
        "metadata": {"name": ROLE_NAME},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": ROLE_NAME,
        },
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
    }
    _apply(rbac.create_cluster_role_binding, binding)
    rbac.replace_cluster_role_binding(ROLE_NAME, binding)
    install_lease_role(rbac)


def install_lease_role(rbac: client.RbacAuthorizationV1Api) -> None:
    """The Lease the operator's replicas share, in its own namespace (a Role, as the chart)."""
    rules = yaml.safe_load(LEASE_RULES_FILE.read_text())
    role = {"metadata": {"name": ROLE_NAME}, "rules": rules}
    _apply(rbac.create_namespaced_role, NAMESPACE, role)
    rbac.replace_namespaced_role(ROLE_NAME, NAMESPACE, role)
    binding = {
        "metadata": {"name": ROLE_NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
    }
    _apply(rbac.create_namespaced_role_binding, NAMESPACE, binding)
    rbac.replace_namespaced_role_binding(ROLE_NAME, NAMESPACE, binding)


class OperatorProcess:
    """`octavo-operator` as a child process; its JSON log goes to LOG_PATH."""

    def __init__(
        self,
        cluster: e2e_cluster.Cluster,
        workdir: Path,
        service_account: tuple[str, str] = (NAMESPACE, SERVICE_ACCOUNT),
        args: tuple[str, ...] = (),
        **env: str,
    ):
        self.cluster = cluster
        self.args = args  # more octavo-operator flags, e.g. ("--namespace", "team-a")
        self.workdir = workdir
        self.service_account = service_account
        self.log_path = workdir / "operator.log"
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.liveness_port = 0
        self.metrics_port = 0

    def start(self) -> None:
        namespace, name = self.service_account
        kubeconfig = e2e_cluster.service_account_kubeconfig(
            self.cluster, namespace, name, self.workdir / "operator.kubeconfig"
        )
        self.liveness_port, self.metrics_port = free_port(), free_port()
        own_port = () if "--activator-port" in self.args else ("--activator-port", str(free_port()))
        command = [
            sys.executable,
            "-m",
            "octavo_operator.main",
            "--kubeconfig",
            str(kubeconfig),
            "--liveness-port",
            str(self.liveness_port),
            "--metrics-port",
            str(self.metrics_port),
            "--log-format",
            "json",
            *own_port,
            *self.args,
        ]
        from e2e.pod_process import dockerfile_env  # (it imports this module)

        env = {**os.environ, **dockerfile_env("operator"), **self.env}  # as the image runs it
        env.pop("KUBECONFIG", None)
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.healthy, timeout=60, what="the operator's /healthz", describe=self.tail)

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator exited:\n{self.tail()}")
        try:
            url = f"http://127.0.0.1:{self.liveness_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    def tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
