"""A Kubernetes control plane for tests, built from Go modules and run on loopback.

from e2e.cluster import up, down, status, service_account_kubeconfig
cluster = up()            # idempotent; builds what is missing (cached)
cluster.kubeconfig        # admin kubeconfig (system:masters)
"""

from .control_plane import COMPONENTS, NODE_NAMES, NODE_RESOURCES, Cluster, down, status, up
from .service_account import request_token, service_account_kubeconfig

__all__ = [
    "COMPONENTS",
    "NODE_NAMES",
    "NODE_RESOURCES",
    "Cluster",
    "down",
    "request_token",
    "service_account_kubeconfig",
    "status",
    "up",
]
