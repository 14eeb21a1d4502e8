"""Install the chart's ValidatingAdmissionPolicy on the test cluster, bound to one namespace.

The policy and its binding are rendered from charts/octavo by `helm template` (the same
objects `helm install` and manifests/ create), with the binding's namespaceSelector narrowed
to the test's namespace so that no other test's InferenceServices are judged by it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from e2e import isvc
from e2e.cluster.paths import REPO_ROOT
from e2e.helpers import wait_for

CHART = REPO_ROOT / "charts/octavo"
TEMPLATE = "templates/admission-policy.yaml"
NAME_LABEL = "kubernetes.io/metadata.name"
Run = Callable[..., Any]


def render(helm: Run, release: str, namespace: str, values: dict[str, Any], tmp: Path) -> Path:
    """The policy and binding for VALUES (under admissionPolicy), in a file for kubectl."""
    scoped = {**values, "namespaceSelector": {"matchLabels": {NAME_LABEL: namespace}}}
    values_file = tmp / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump({"admissionPolicy": scoped}))
    text = helm(
        "template", release, str(CHART), "--show-only", TEMPLATE, "--values", str(values_file)
    ).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(text) if d]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"], kinds
    out = tmp / f"{release}-policy.yaml"
    out.write_text(text)
    return out


def refusal(custom: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> str | None:
    """The apiserver's message when it refuses a dry-run create of BODY, else None."""
    try:
        custom.create_namespaced_custom_object(
            isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, body, dry_run="All"
        )
    except client.ApiException as error:
        return json.loads(error.body)["message"]
    return None


def wait_until_enforced(
    custom: client.CustomObjectsApi, namespace: str, refused_spec: dict[str, Any]
) -> str:
    """A new binding takes effect after the apiserver's informers see it: poll a spec the
    policy refuses until it is refused."""
    body = isvc.manifest("probe", refused_spec)
    return wait_for(
        lambda: refusal(custom, namespace, body),
        timeout=30,
        what="the admission policy to take effect",
    )


def wait_until_lifted(
    custom: client.CustomObjectsApi, namespace: str, refused_spec: dict[str, Any]
) -> None:
    """The reverse of ``wait_until_enforced``: after the policy is deleted, the apiserver
    keeps enforcing it until its informers see the deletion; poll until it no longer does."""
    body = isvc.manifest("probe", refused_spec)
    wait_for(
        lambda: refusal(custom, namespace, body) is None,
        timeout=60,
        what="the deleted admission policy to stop judging InferenceServices",
    )
