"""The LeaderWorkerSet controller (sigs.k8s.io/lws, built by `e2e.cluster build`) as a local
process against the test cluster, with its admission webhooks reachable by the apiserver.

LWS normally runs in the cluster behind the Service `lws-webhook-service`, with a certificate
its built-in rotator makes for that Service's DNS name. Neither works here: the apiserver
cannot resolve `.svc` names and EndpointSlices refuse loopback addresses. So the controller
runs with `internalCertManagement.enable: false` and serves its webhooks on
`https://127.0.0.1:<free port>` with a certificate the cluster CA issues for IP 127.0.0.1
(`pki.issue`); the Mutating/ValidatingWebhookConfigurations are registered by this module
with `clientConfig.url` and `caBundle` = the cluster CA, after the controller serves.

The webhooks fail closed (`failurePolicy: Fail`), so they are deleted BEFORE the process
stops; they only match LeaderWorkerSets, DisaggregatedSets and pods labelled
`leaderworkerset.sigs.k8s.io/name`, so other tests never call them. The pod webhook is the
one that injects LWS_LEADER_ADDRESS / LWS_GROUP_SIZE / LWS_WORKER_INDEX into every container.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from e2e import cluster as e2e_cluster
from e2e.cluster import build, pki
from e2e.helpers import wait_for
from e2e.lws import GROUP, NAME_LABEL, PLURAL, VERSION, manifest
from e2e.operator_process import install_crd
from e2e.ports import free_port

MUTATING = "lws-mutating-webhook-configuration"  # the stock chart's names
VALIDATING = "lws-validating-webhook-configuration"
RULE_LWS = {"apiGroups": [GROUP], "apiVersions": [VERSION], "resources": [PLURAL]}
RULE_DS = {
    "apiGroups": ["disaggregatedset.x-k8s.io"],
    "apiVersions": ["v1"],
    "resources": ["disaggregatedsets"],
}
RULE_POD = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
POD_SELECTOR = {"matchExpressions": [{"key": NAME_LABEL, "operator": "Exists"}]}
CREATE_UPDATE = ("CREATE", "UPDATE")


@dataclass(frozen=True)
class Webhook:
    configuration: str  # MUTATING or VALIDATING
    name: str
    path: str
    rule: dict[str, list[str]]
    operations: tuple[str, ...] = CREATE_UPDATE
    object_selector: dict[str, Any] | None = None


# The stock chart's charts/lws/templates/webhook/webhook.yaml at v0.9.0.
WEBHOOKS = (
    Webhook(
        MUTATING,
        "mleaderworkerset.kb.io",
        "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        RULE_LWS,
    ),
    Webhook(MUTATING, "mpod.kb.io", "/mutate--v1-pod", RULE_POD, ("CREATE",), POD_SELECTOR),
    Webhook(
        VALIDATING,
        "vleaderworkerset.kb.io",
        "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        RULE_LWS,
    ),
    Webhook(VALIDATING, "vpod.kb.io", "/validate--v1-pod", RULE_POD, CREATE_UPDATE, POD_SELECTOR),
    Webhook(
        VALIDATING,
        "vdisaggregatedset.kb.io",
        "/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset",
        RULE_DS,
    ),
)
STOP_GRACE_S = 15.0


def binaries() -> tuple[Path, list[Path]]:
    """The built controller and its CRD files (built on first use, then cached)."""
    binary = build.ensure_built(("lws",))["lws-controller"]
    return binary, [binary.parent / name for name in build.LWS_CRDS]


def config_text(webhook_port: int, health_port: int, cert_dir: Path) -> str:
    """The controller's Configuration (config.lws.x-k8s.io/v1alpha1, decoded strictly)."""
    config = {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }
    return yaml.safe_dump(config, sort_keys=False)


def issue_serving_cert(cluster: e2e_cluster.Cluster, cert_dir: Path) -> None:
    """tls.crt/tls.key for 127.0.0.1, signed by the cluster CA (which the apiserver trusts
    through each webhook's caBundle)."""
    pdir = cluster.state_dir / "pki"
    ca = pki.Pair(pdir / "ca.crt", pdir / "ca.key")
    cert_dir.mkdir(parents=True, exist_ok=True)
    pair = pki.issue(ca, cert_dir, "lws-webhook", "lws-webhook", server=True, ips=("127.0.0.1",))
    shutil.copy(pair.cert, cert_dir / "tls.crt")
    shutil.copy(pair.key, cert_dir / "tls.key")


def webhook_configurations(url: str, ca_bundle: str) -> dict[str, dict[str, Any]]:
    """The two configurations, each webhook calling URL + its path, trusting CA_BUNDLE."""
    out: dict[str, dict[str, Any]] = {
        name: {"metadata": {"name": name, "labels": {"octavo.dev/e2e": "lws"}}, "webhooks": []}
        for name in (MUTATING, VALIDATING)
    }
    for webhook in WEBHOOKS:
        hook = {
            "name": webhook.name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {"url": f"{url}{webhook.path}", "caBundle": ca_bundle},
            "rules": [{**webhook.rule, "operations": list(webhook.operations)}],
        }
        if webhook.object_selector is not None:
            hook["objectSelector"] = webhook.object_selector
        out[webhook.configuration]["webhooks"].append(hook)
    return out


@dataclass
class LwsController:
    """`lws-controller` as a child process (its own session), log in WORKDIR/lws.log."""

    cluster: e2e_cluster.Cluster
    api: client.ApiClient
    workdir: Path
    proc: subprocess.Popen | None = None
    webhook_port: int = 0
    health_port: int = 0
    registered: list[str] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.workdir / "lws.log"

    def start(self) -> None:
        binary, crds = binaries()
        apiext = client.ApiextensionsV1Api(self.api)
        for crd in crds:  # before the process: its informers need the kinds served
            install_crd(apiext, crd)
        self._delete_webhooks()  # a crashed earlier session may have left them behind
        self.webhook_port, self.health_port = free_port(), free_port()
        cert_dir = self.workdir / "certs"
        issue_serving_cert(self.cluster, cert_dir)
        config = self.workdir / "config.yaml"
        config.write_text(config_text(self.webhook_port, self.health_port, cert_dir))
        argv = [str(binary), f"--config={config}", f"--kubeconfig={self.cluster.kubeconfig}"]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*argv, "--zap-devel=false"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        wait_for(self._serving, timeout=60, what="the LWS webhook's TLS", describe=self.tail)
        self._register_webhooks()
        wait_for(
            self._admits, timeout=30, what="an LWS dry-run through the webhooks", describe=self.tail
        )

    def _serving(self) -> bool:
        """A TLS handshake on the webhook port verifies against the cluster CA."""
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"lws-controller exited:\n{self.tail()}")
        context = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        address = ("127.0.0.1", self.webhook_port)
        try:
            with (
                socket.create_connection(address, timeout=2) as sock,
                context.wrap_socket(sock, server_hostname="127.0.0.1"),
            ):
                return True
        except OSError:
            return False

    def _register_webhooks(self) -> None:
        ca_bundle = base64.b64encode(self.cluster.ca_file.read_bytes()).decode()
        configs = webhook_configurations(f"https://127.0.0.1:{self.webhook_port}", ca_bundle)
        admission = client.AdmissionregistrationV1Api(self.api)
        admission.create_mutating_webhook_configuration(configs[MUTATING])
        self.registered.append(MUTATING)
        admission.create_validating_webhook_configuration(configs[VALIDATING])
        self.registered.append(VALIDATING)

    def _admits(self) -> bool:
        """A server-side dry-run create: the mutating webhook fills in the rollout defaults."""
        custom = client.CustomObjectsApi(self.api)
        try:
            made = custom.create_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, manifest("e2e-probe", size=1), dry_run="All"
            )
        except client.ApiException:
            return False
        rolling = made["spec"].get("rolloutStrategy", {}).get("rollingUpdateConfiguration")
        return rolling is not None

    def _delete_webhooks(self) -> None:
        admission = client.AdmissionregistrationV1Api(self.api)
        for name, delete in (
            (MUTATING, admission.delete_mutating_webhook_configuration),
            (VALIDATING, admission.delete_validating_webhook_configuration),
        ):
            try:
                delete(name)
            except client.ApiException as error:
                if error.status != 404:
                    raise
        self.registered.clear()

    def stop(self) -> None:
        """Webhooks first (they fail closed), then the process group."""
        self._delete_webhooks()
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
