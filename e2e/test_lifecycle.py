"""The whole lifecycle, as a user meets Octavo: install (helm, or kubectl apply -f manifests/)
-> apply the SmolLM2 example -> Ready -> the pod's own command answers an OpenAI call and a
real Prometheus scrapes it -> upgrade / edit / delete / uninstall.

The operator runs as a local process with a kubeconfig minted for the ServiceAccount the
chart (or manifests/) created, so the chart's RBAC is what is tested. The pod's container
runs as a local process (e2e/pod_process.py): kwok only plays its kubelet's status part.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from kubernetes import client

from e2e import cluster as e2e_cluster
from e2e import isvc
from e2e.admission_policy import wait_until_lifted
from e2e.cluster.paths import REPO_ROOT
from e2e.helpers import wait_for
from e2e.operator_process import OperatorProcess
from e2e.pod_process import PodProcess, dockerfile_env
from octavo.model_executor.embedded import cache_root, prepare_embedded_model
from tests.prometheus_runner import (
    ScrapeJob,
    find_prometheus,
    running_prometheus,
)

CHART = REPO_ROOT / "charts/octavo"
EXAMPLE = REPO_ROOT / "manifests/examples/smollm2-cpu.yaml"
EXAMPLE_NAME, SERVED_NAME = "smollm2-cpu", "smollm2"
BAKED_MODELS = "/opt/octavo/models"  # where the Dockerfile's server target bakes the model
CRD_NAME = "inferenceservices.octavo.dev"
# A spec the chart's admission policy refuses: the probe that it has stopped judging.
OUTSIDE_ALLOWED_REGISTRIES = {"image": "registry.invalid/octavo/probe:0"}
Run = Callable[..., Any]


@pytest.fixture(scope="module")
def baked_models() -> Path:
    """A local stand-in for the image's baked model folder (converted once, then cached)."""
    return prepare_embedded_model(cache_root() / "models").parent


def adopt_crd_for_helm(apiext: client.ApiextensionsV1Api, release: str, namespace: str) -> None:
    """A CRD created outside Helm (by other tests, or by kubectl apply -f manifests/) is
    adopted the documented way, so `helm install` can take it over."""
    try:
        apiext.read_custom_resource_definition(CRD_NAME)
    except client.ApiException as error:
        if error.status == 404:
            return
        raise
    meta = {
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {
            "meta.helm.sh/release-name": release,
            "meta.helm.sh/release-namespace": namespace,
        },
    }
    apiext.patch_custom_resource_definition(CRD_NAME, {"metadata": meta})


def operator_deployment(apps: client.AppsV1Api, namespace: str) -> client.V1Deployment:
    selector = "app.kubernetes.io/component=operator"
    found = apps.list_namespaced_deployment(namespace, label_selector=selector).items
    assert len(found) == 1, [d.metadata.name for d in found]
    return found[0]


def start_operator_like(
    cluster: e2e_cluster.Cluster, apps: client.AppsV1Api, namespace: str, workdir: Path
) -> OperatorProcess:
    """The operator as its Deployment describes it: its ServiceAccount, its environment."""
    dep = operator_deployment(apps, namespace)
    pod = dep.spec.template.spec
    env = {e.name: e.value for e in pod.containers[0].env or [] if e.value is not None}
    operator = OperatorProcess(cluster, workdir, (namespace, pod.service_account_name), **env)
    operator.start()
    return operator


def run_helm_test_hook(
    cluster: e2e_cluster.Cluster, helm: Run, release_ns: str, operator: OperatorProcess, tmp: Path
) -> None:
    """`helm test`, minus the pod: run the test hook's command as its ServiceAccount, with the
    operator's in-cluster URL pointed at the local operator."""
    hooks = [
        d for d in yaml.safe_load_all(helm("get", "hooks", "octavo", "-n", release_ns).stdout) if d
    ]
    (pod,) = [h for h in hooks if h["metadata"]["annotations"]["helm.sh/hook"] == "test"]
    container = pod["spec"]["containers"][0]
    args = list(container["args"])
    url = args[args.index("--operator-url") + 1]
    local = f"http://127.0.0.1:{operator.liveness_port}/{url.split('/', 3)[3]}"
    args[args.index("--operator-url") + 1] = local
    account = pod["spec"].get("serviceAccountName", "default")
    kubeconfig = e2e_cluster.service_account_kubeconfig(
        cluster, release_ns, account, tmp / "helm-test.kubeconfig"
    )
    command = [str(Path(sys.executable).parent / container["command"][0]), *args]
    ok = subprocess.run(
        [*command, "--kubeconfig", str(kubeconfig), "--timeout", "20"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    args[args.index("--operator-url") + 1] = "http://127.0.0.1:1/healthz"  # nothing listens
    bad = subprocess.run(
        [*command[:1], *args, "--kubeconfig", str(kubeconfig), "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "healthy=False" in bad.stderr


def serve_example(
    api_client: client.ApiClient,
    custom: client.CustomObjectsApi,
    kubectl: Run,
    namespace: str,
    workdir: Path,
    baked_models: Path,
) -> None:
    """Apply the example, wait for Ready, run its pod's command and call it."""
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    obj = isvc.wait_condition(custom, namespace, EXAMPLE_NAME, "Ready", "True", timeout=90)
    assert obj["status"]["url"] == f"http://{EXAMPLE_NAME}.{namespace}.svc.cluster.local:8000/v1"
    core = client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod(
        namespace, label_selector=f"app.kubernetes.io/instance={EXAMPLE_NAME}"
    ).items
    assert len(pods) == 1
    pod = PodProcess(
        api_client.sanitize_for_serialization(pods[0]),
        workdir,
        image_paths={BAKED_MODELS: baked_models},
    )
    pod.start(dockerfile_env("server"))
    try:
        pod.wait_probe("startupProbe", limit=300)
        pod.wait_probe("readinessProbe")
        call_and_scrape(pod, workdir)
    finally:
        assert pod.stop() == 0, pod.log_tail()  # SIGTERM drains and exits 0


def call_and_scrape(pod: PodProcess, workdir: Path) -> None:
    base = f"http://127.0.0.1:{pod.local_port('http')}/v1"
    api = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    reply = api.chat.completions.create(
        model=SERVED_NAME,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].message.content
    generated = reply.usage.completion_tokens
    annotations = pod.pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    target = f"127.0.0.1:{pod.local_port(int(annotations['prometheus.io/port']))}"
    job = ScrapeJob("octavo-pod", (target,), annotations["prometheus.io/path"])
    binary = find_prometheus()
    assert binary, "prometheus is installed by scripts/install-test-tools.sh (make test)"
    with running_prometheus(binary, [job], workdir) as prometheus:
        query = f'sum(vllm:generation_tokens_total{{model_name="{SERVED_NAME}"}})'
        assert prometheus.wait_for(query, float(generated)) == generated


def edit_rolls_and_delete_cleans(
    custom: client.CustomObjectsApi, apps: client.AppsV1Api, namespace: str
) -> None:
    selector = f"app.kubernetes.io/instance={EXAMPLE_NAME}"

    def edited(template: client.V1PodTemplateSpec) -> bool:
        args = template.spec.containers[0].args
        return args[args.index("--max-num-seqs") + 1] == "4"

    def rolled_sets() -> list[client.V1ReplicaSet]:
        """The ReplicaSets of the edited template (counting all of them raced the
        ReplicaSet of the image upgrade just before, which a loaded controller makes late)."""
        sets = apps.list_namespaced_replica_set(namespace, label_selector=selector).items
        return [rs for rs in sets if edited(rs.spec.template)]

    assert not rolled_sets()
    isvc.patch(custom, namespace, EXAMPLE_NAME, {"spec": {"engine": {"maxNumSeqs": 4}}})
    wait_for(
        lambda: edited(apps.read_namespaced_deployment(EXAMPLE_NAME, namespace).spec.template),
        timeout=15,
        what="the edited engine args in the Deployment",
    )
    wait_for(rolled_sets, timeout=30, what="a new ReplicaSet (a rolling update)")
    isvc.wait_condition(custom, namespace, EXAMPLE_NAME, "Ready", "True", timeout=60)
    custom.delete_namespaced_custom_object(
        isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, EXAMPLE_NAME
    )
    wait_for(
        lambda: not apps.list_namespaced_deployment(namespace, label_selector=selector).items,
        timeout=60,
        what="the Deployment to be garbage-collected",
    )


def test_helm_install_to_openai_call_to_uninstall(
    cluster,
    no_other_operator,
    namespace,
    helm,
    kubectl,
    api_client,
    apps,
    custom,
    apiext,
    tmp_path,
    baked_models,
):
    release_ns = f"octavo-helm-{secrets.token_hex(3)}"
    adopt_crd_for_helm(apiext, "octavo", release_ns)
    helm(
        "install",
        "octavo",
        str(CHART),
        "-n",
        release_ns,
        "--create-namespace",
        "--wait",
        "--timeout",
        "2m",
    )
    operator = start_operator_like(cluster, apps, release_ns, tmp_path / "operator")
    try:
        run_helm_test_hook(cluster, helm, release_ns, operator, tmp_path)
        serve_example(api_client, custom, kubectl, namespace, tmp_path, baked_models)

        helm(
            "upgrade",
            "octavo",
            str(CHART),
            "-n",
            release_ns,
            "--reuse-values",
            "--set",
            "operator.serverImage.tag=0.1.1",
            "--wait",
            "--timeout",
            "2m",
        )
        env = operator_deployment(apps, release_ns).spec.template.spec.containers[0].env
        images = [e.value for e in env if e.name == "OCTAVO_OPERATOR_DEFAULT_IMAGE"]
        assert images and images[0].endswith(":0.1.1")
        operator.stop()  # the upgraded Deployment restarts the operator with the new env
        operator = start_operator_like(cluster, apps, release_ns, tmp_path / "operator-2")

        def server_image() -> str:
            dep = apps.read_namespaced_deployment(EXAMPLE_NAME, namespace)
            return dep.spec.template.spec.containers[0].image

        wait_for(
            lambda: server_image().endswith(":0.1.1"),
            timeout=20,
            what="the new default server image in the example's Deployment",
        )
        edit_rolls_and_delete_cleans(custom, apps, namespace)
    finally:
        operator.stop()
        helm("uninstall", "octavo", "-n", release_ns, "--wait", "--timeout", "2m")
        wait_until_lifted(custom, namespace, OUTSIDE_ALLOWED_REGISTRIES)
    assert apiext.read_custom_resource_definition(CRD_NAME)  # kept: users' data survives
    assert not apps.list_namespaced_deployment(release_ns).items
    client.CoreV1Api(api_client).delete_namespace(release_ns)


def test_kubectl_apply_manifests_to_openai_call(
    cluster,
    no_other_operator,
    namespace,
    kubectl,
    api_client,
    apps,
    custom,
    tmp_path,
    baked_models,
):
    kubectl("apply", "-f", str(REPO_ROOT / "manifests/crds"), "-f", str(REPO_ROOT / "manifests"))
    operator = None
    try:

        def all_ready() -> bool:
            deployment = operator_deployment(apps, "octavo-system")
            return deployment.status.ready_replicas == deployment.spec.replicas == 2

        wait_for(all_ready, timeout=60, what="the operator Deployment (2 replicas) from manifests/")
        operator = start_operator_like(cluster, apps, "octavo-system", tmp_path / "operator")
        serve_example(api_client, custom, kubectl, namespace, tmp_path, baked_models)
        edit_rolls_and_delete_cleans(custom, apps, namespace)
    finally:
        if operator is not None:
            operator.stop()
        # Always: manifests/ holds a cluster-wide admission policy that would judge the
        # InferenceServices of every later test.
        kubectl("delete", "-f", str(REPO_ROOT / "manifests"), "--wait=false")
        wait_until_lifted(custom, namespace, OUTSIDE_ALLOWED_REGISTRIES)
