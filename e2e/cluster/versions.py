"""Every version the test control plane is built from, pinned in this one place.

Changing a Go-built version here needs `python -m e2e.cluster gomod` afterwards: it regenerates
the wrapper module's go.mod/go.sum (e2e/cluster/go.mod, one module for every binary) from the
pinned releases, and `build` refuses to run while they disagree with this file. In that one
module every shared library resolves to one version (the highest any of them asks for; the
k8s.io/* staging modules to the Kubernetes release's own, whatever the others declare).
"""

from __future__ import annotations

# Kubernetes release for kube-apiserver, kube-controller-manager, kube-scheduler and kubectl.
# Its staging modules (k8s.io/api, k8s.io/apiserver, ...) are published as v0.<minor>.<patch>.
# v1.36.5 is on the module proxy but the checksum database does not answer for it (404), so
# v1.36.4 is the newest 1.36 release that verifies. 1.36 is built with Go 1.26.
KUBERNETES = "v1.36.4"

# etcd server (go.etcd.io/etcd/server/v3); Kubernetes 1.36 uses the 3.6 client.
ETCD = "v3.6.16"

# kwok controller (sigs.k8s.io/kwok/cmd/kwok); v0.8.0 declares go 1.26.0 and k8s.io/* v0.36.1.
KWOK = "v0.8.0"

# Helm 3 (helm.sh/helm/v3/cmd/helm); 3.21 is built against client-go v0.36 like the cluster.
HELM = "v3.21.4"

# The endpoint picker (EPP) of the llm-d router (github.com/llm-d/llm-d-router, cmd/epp), the
# Gateway API Inference Extension's picker with llm-d's scorers (precise prefix cache from
# vLLM-format KV events). v0.10.0 is the newest release the module proxy serves as a zip;
# it serves neither its .mod/.info nor a checksum-database entry, so the zip is fetched from
# the proxy directly, checked against this SHA-256 (taken on 2026-11-26) and built through a
# `replace` to the unpacked folder (e2e/cluster/go.mod). Its dependencies verify as usual.
# It declares k8s.io/* v0.35.7 and controller-runtime v0.23.3; it is built with v0.36.4 and
# v0.24.1 (the LWS controller's), like everything else in the one wrapper module.
LLM_D_ROUTER = "v0.10.0"
LLM_D_ROUTER_ZIP_SHA256 = "9524db96c27fb21544c0ab0cf68b0b5f4092a0a43f2ef0121583daa639181946"

# LeaderWorkerSet controller (sigs.k8s.io/lws, cmd/), the multi-node InferenceService's pod
# groups. v0.10.0's zip is refused by the module proxy (403, 2026-11-26) and the version list is
# refused too; v0.9.0's .info/.mod/.zip and its checksum-database entry are served. It has no
# replace lines and declares go 1.26.0.
LWS = "v0.9.0"

# Oldest Go toolchain that builds all of the above (they declare `go 1.26.0`). Toolchain
# downloads are disabled (GOTOOLCHAIN=local): the installed `go` must be this new.
GO_MIN = (1, 26)


def staging_version(kubernetes: str = KUBERNETES) -> str:
    """The version of the k8s.io/* staging modules that belong to a Kubernetes release."""
    major, minor, patch = kubernetes.lstrip("v").split(".")
    if major != "1":
        raise ValueError(f"unexpected Kubernetes version {kubernetes}")
    return f"v0.{minor}.{patch}"


def summary() -> dict[str, str]:
    return {
        "kubernetes": KUBERNETES,
        "kubernetes staging modules": staging_version(),
        "etcd": ETCD,
        "kwok": KWOK,
        "helm": HELM,
        "llm-d router (EPP)": LLM_D_ROUTER,
        "leaderworkerset (lws)": LWS,
        "go (minimum)": ".".join(map(str, GO_MIN)),
    }
