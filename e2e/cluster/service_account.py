"""Mint a kubeconfig that acts as a ServiceAccount, through the TokenRequest API.

Used to run a component (e.g. the operator) with exactly the rights its RBAC grants:
`python -m e2e.cluster sa-kubeconfig NAMESPACE NAME -o operator.kubeconfig`.
"""

from __future__ import annotations

from pathlib import Path

from .control_plane import Cluster, kubeconfig_text


def request_token(
    cluster: Cluster,
    namespace: str,
    name: str,
    *,
    duration_seconds: int = 3600,
    audiences: list[str] | None = None,
) -> str:
    """A bound token for NAMESPACE/NAME (the ServiceAccount must exist)."""
    spec: dict = {"expirationSeconds": duration_seconds}
    if audiences:
        spec["audiences"] = audiences
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    return cluster.admin().post(path, body)["status"]["token"]


def service_account_kubeconfig(
    cluster: Cluster,
    namespace: str,
    name: str,
    path: Path | None = None,
    *,
    duration_seconds: int = 3600,
    create: bool = False,
) -> Path:
    """Write a kubeconfig for NAMESPACE/NAME to PATH (default: in the cluster's state folder)
    and return its path. With CREATE, the ServiceAccount is created first if missing."""
    if create:
        admin = cluster.admin()
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        admin.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", sa, ok=(201, 409))
    token = request_token(cluster, namespace, name, duration_seconds=duration_seconds)
    if path is None:
        folder = cluster.state_dir / "kubeconfigs"
        path = folder / f"sa-{namespace}-{name}.kubeconfig"
    user = f"system:serviceaccount:{namespace}:{name}"
    text = kubeconfig_text(cluster.server, cluster.ca_file, user, token=token, namespace=namespace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path
