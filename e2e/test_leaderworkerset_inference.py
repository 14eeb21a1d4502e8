"""An InferenceService with `spec.engine.nodes: 2` on the real control plane: the operator
makes a LeaderWorkerSet, the LWS controller (e2e/lws_controller.py) makes a group of two
pods with LWS_* injected, and the pods' own commands run as real processes and serve.

The operator's leader/worker args name `$(LWS_GROUP_SIZE)`, `$(LWS_WORKER_INDEX)` and
`$(LWS_LEADER_ADDRESS)`, which the pods' env (from the LWS pod webhook) expands, as the
kubelet would (`PodProcess.expand`). Two things a real cluster provides are stood in for:
- LWS_LEADER_ADDRESS is `<leader pod>.<headless service>.<namespace>`, a name only the
  cluster's DNS resolves: both processes get the leader pod's loopback IP instead (its
  status.podIP, `move_to_loopback`), the address that name resolves to in a cluster;
- `--master-port` (29501, and torch's rendezvous on the next port) would be shared by every
  test on this one machine: both processes get the same free pair of ports instead.
Everything else (args, env, the OCTAVO_NODE_KEY Secret, probes) is the operator's. Last, a
deleted worker pod makes the LWS controller recreate the group (e2e/lws_recreate.py) and the
service is Ready again.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
from pathlib import Path

import openai
import pytest
from kubernetes import client

from e2e import isvc, lws
from e2e.helpers import wait_for
from e2e.loopback_pod import move_to_loopback, temporary_tiny_llama
from e2e.lws_recreate import delete_worker_and_wait_new_group
from e2e.pod_process import PodProcess, dockerfile_env
from octavo.cache_dirs import cache_root
from tests.multinode_cluster import free_port_pair

NAME = "multi"
LWS_NAME = f"{NAME}-lws"  # the operator's LeaderWorkerSet (not the Service's name)
NODE_KEY_SECRET = f"{NAME}-node-key"
KERNELS_IN_IMAGE = "/opt/octavo/kernels"  # the Dockerfile's prebuilt CPU kernels


@pytest.fixture
def tiny_model():
    with temporary_tiny_llama("e2e-lws-") as model:
        yield model


def spec_of(model: Path) -> dict:
    """Two nodes, pipeline parallel 2 (one stage per node), on CPU."""
    return {
        "model": {"uri": f"file://{model}", "servedName": "tiny"},
        "resources": {"gpu": 0},
        "engine": {
            "nodes": 2,
            "pipelineParallelSize": 2,
            "maxModelLen": 128,
            "extraArgs": ["--kv-cache-memory", "64MiB", "--node-join-timeout", "240"],
        },
    }


def flag(args: list[str], name: str) -> str:
    assert name in args, f"{name} not in {args}"
    return args[args.index(name) + 1]


def test_nodes_two_becomes_a_leaderworkerset_whose_pods_serve(
    lws_controller, operator, namespace, api_client, core, custom, tiny_model, tmp_path
):
    isvc.create(custom, namespace, isvc.manifest(NAME, spec_of(tiny_model)))
    made = wait_for(lambda: _lws_or_none(custom, namespace), timeout=30, what="the operator's LWS")
    template = made["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    group = lws.wait_group_ready(core, namespace, LWS_NAME)
    isvc.wait_condition(custom, namespace, NAME, "Ready", "True")  # from the LWS's status
    leader, worker = group.leader, group.workers[0]
    check_pod_args(leader, rank="0", headless=False)
    check_pod_args(worker, rank="$(LWS_WORKER_INDEX)", headless=True)
    for index, pod in enumerate(group.pods):
        env = lws.env_of(pod)
        assert env["LWS_LEADER_ADDRESS"] == f"{LWS_NAME}-0.{LWS_NAME}.{namespace}"
        assert (env["LWS_GROUP_SIZE"], env["LWS_WORKER_INDEX"]) == ("2", str(index))
        key = next(e for e in pod.spec.containers[0].env if e.name == "OCTAVO_NODE_KEY")
        assert key.value_from.secret_key_ref.name == NODE_KEY_SECRET
    serve_group(api_client, core, namespace, group, tmp_path)
    # The group is restarted together: a worker pod deleted -> a new leader and worker.
    after = delete_worker_and_wait_new_group(core, namespace, LWS_NAME, group)
    assert [p.metadata.name for p in after.pods] == [p.metadata.name for p in group.pods]
    isvc.wait_condition(custom, namespace, NAME, "Ready", "True")


def _lws_or_none(custom: client.CustomObjectsApi, namespace: str) -> dict | None:
    try:
        return lws.get(custom, namespace, LWS_NAME)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def check_pod_args(pod: client.V1Pod, rank: str, headless: bool) -> None:
    args = pod.spec.containers[0].args
    assert flag(args, "--nnodes") == "$(LWS_GROUP_SIZE)"
    assert flag(args, "--node-rank") == rank
    assert flag(args, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert flag(args, "--master-port") == "29501"
    assert ("--headless" in args) is headless
    assert flag(args, "--pipeline-parallel-size") == "2"


def serve_group(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, group, tmp_path: Path
) -> None:
    """Both pods' commands as processes: the worker joins the leader, the leader serves."""
    leader, worker = (
        loopback_process(api_client, core, namespace, pod, tmp_path / role)
        for pod, role in ((group.leader, "leader"), (group.workers[0], "worker"))
    )
    port = str(free_port_pair())
    for process in (leader, worker):
        process.env_overrides["LWS_LEADER_ADDRESS"] = str(leader.pod_ip)
        process.arg_overrides["--master-port"] = port
    image_env = {**dockerfile_env("server"), "HF_HUB_OFFLINE": "1"}
    worker.start(image_env)
    leader.start(image_env)
    try:
        leader.wait_probe("startupProbe", limit=300)
        leader.wait_probe("readinessProbe")
        api = openai.OpenAI(base_url=f"{leader.base_url('http')}/v1", api_key="-", max_retries=0)
        reply = api.completions.create(
            model="tiny", prompt="hello", max_tokens=6, extra_body={"ignore_eos": True}
        )
        assert reply.usage.completion_tokens == 6
    finally:
        leader_rc = leader.stop()
        worker_rc = wait_exit(worker)
    assert leader_rc == 0, leader.log_tail()
    assert worker_rc == 0, worker.log_tail()  # a headless worker exits 0 after a clean stop


def loopback_process(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    pod: client.V1Pod,
    workdir: Path,
) -> PodProcess:
    """POD on a loopback IP of its own, with the node key from its Secret."""
    workdir.mkdir(parents=True, exist_ok=True)
    process = move_to_loopback(core, api_client, namespace, pod, workdir)
    secret = core.read_namespaced_secret(NODE_KEY_SECRET, namespace)
    for key, value in (secret.data or {}).items():
        process.secrets[(NODE_KEY_SECRET, key)] = base64.b64decode(value).decode()
    process.image_paths[KERNELS_IN_IMAGE] = cache_root() / "kernels"
    return process


def wait_exit(process: PodProcess, timeout: float = 60) -> int | None:
    """PROCESS's exit code once it ends by itself (stopped with SIGTERM after TIMEOUT s)."""
    if process.proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.proc.wait(timeout=timeout)
    return process.stop()
