"""The shipped tensor-parallel example serves: manifests/examples/tensor-parallel-autoscaled.yaml
(tensorParallelSize 2) -> Ready -> its pod's own command, run as a process on CPU, starts two
worker processes and answers the openai client.

The example names hf://Qwen/Qwen2.5-32B-Instruct; a cluster without internet serves it from
a pre-seeded cache volume, so the test seeds the pod's cache volume with a tiny random Qwen2
laid out as the Hugging Face cache does, under that name (HF_HUB_OFFLINE=1, as in an
air-gapped cluster). Everything else — args, env, probes — is the operator's.
"""

from __future__ import annotations

from pathlib import Path

import openai
import yaml
from kubernetes import client
from transformers import AutoTokenizer

from e2e import isvc
from e2e.cluster.paths import REPO_ROOT
from e2e.helpers import persistent_volume_for
from e2e.pod_process import PodProcess, dockerfile_env
from octavo.cache_dirs import cache_root
from octavo.model_executor.embedded import prepare_embedded_model
from tests.hub_cache import seed_snapshot
from tests.rank_processes import rank_processes
from tests.tiny_models import build_tiny_model

EXAMPLE = REPO_ROOT / "manifests/examples/tensor-parallel-autoscaled.yaml"
KERNELS_IN_IMAGE = "/opt/octavo/kernels"  # the Dockerfile's prebuilt CPU kernels


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def seed_cache_volume(pod: PodProcess, repo_id: str, tmp_path: Path) -> None:
    """A tiny Qwen2 (2 KV heads: one per rank) in the pod's cache, as the example's model."""
    tokenizer = AutoTokenizer.from_pretrained(prepare_embedded_model(cache_root() / "models"))
    source = build_tiny_model(
        tmp_path / "tiny-qwen2", "qwen2", tokenizer, max_position_embeddings=32768
    )
    env = pod.environment(dockerfile_env("server"))
    seed_snapshot(Path(env["OCTAVO_CACHE"]) / "hf", repo_id, source, ("main",))


def test_tensor_parallel_example_pod_command_serves_on_cpu(
    operator, namespace, kubectl, api_client, core, custom, tmp_path
):
    spec = example()
    name = spec["metadata"]["name"]
    with persistent_volume_for(core, namespace, f"{name}-cache", spec["spec"]["cache"]["size"]):
        kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
        isvc.wait_condition(custom, namespace, name, "Ready", "True", timeout=90)
        serve_pod_command(spec, api_client, namespace, tmp_path)


def serve_pod_command(spec: dict, api_client, namespace: str, tmp_path: Path) -> None:
    name = spec["metadata"]["name"]
    pods = (
        client.CoreV1Api(api_client)
        .list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={name}")
        .items
    )
    pod = PodProcess(
        api_client.sanitize_for_serialization(pods[0]),
        tmp_path,
        image_paths={KERNELS_IN_IMAGE: cache_root() / "kernels"},
    )
    args = pod.container["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    seed_cache_volume(pod, spec["spec"]["model"]["uri"].removeprefix("hf://"), tmp_path)
    pod.start({**dockerfile_env("server"), "HF_HUB_OFFLINE": "1"})
    try:
        pod.wait_probe("startupProbe", limit=300)
        pod.wait_probe("readinessProbe")
        workers = rank_processes(pod.proc.pid)
        assert len(workers) == 2, pod.log_tail()
        base = f"http://127.0.0.1:{pod.local_port('http')}/v1"
        api = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
        reply = api.chat.completions.create(
            model=spec["spec"]["model"]["servedName"],
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage.completion_tokens == 8
    finally:
        assert pod.stop() == 0, pod.log_tail()  # SIGTERM drains and exits 0
    assert not any(worker.is_running() and worker.status() != "zombie" for worker in workers)
