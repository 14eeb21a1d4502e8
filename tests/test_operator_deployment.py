"""The Deployment builder, field by field, for a set of InferenceService specs."""

from __future__ import annotations

from octavo_operator.builders.deployment import deployment

from isvc_factories import isvc

IMAGE = "registry.example/octavo-server:1"


def container(spec: dict | None = None) -> dict:
    return deployment(isvc(spec), IMAGE)["spec"]["template"]["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_embedded_model_on_cpu():
    dep = deployment(isvc({"resources": {"gpu": 0, "cpu": "2", "memory": "4Gi"}}), IMAGE)
    assert dep["metadata"]["name"] == "chat"
    assert dep["metadata"]["namespace"] == "team-a"
    owner = dep["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "InferenceService",
        "chat",
        "uid-1",
        True,
    )
    assert dep["spec"]["replicas"] == 1
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "octavo-server",
        "app.kubernetes.io/instance": "chat",
    }
    assert dep["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == IMAGE and c["command"] == ["octavo"]
    args = c["args"]
    assert args[0] == "serve" and args[1] == "--host"  # no model argument: the embedded one
    assert flag(args, "--port") == "8000" and flag(args, "--served-model-name") == "chat"
    assert flag(args, "--device") == "cpu" and "--gpu-memory-utilization" not in args
    assert c["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"cpu": "2", "memory": "4Gi"},
    }


def test_engine_flags_follow_the_spec():
    args = container(
        {
            "model": {
                "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                "revision": "main",
                "servedName": "llama",
            },
            "engine": {
                "maxModelLen": 8192,
                "maxNumSeqs": 64,
                "maxNumBatchedTokens": 4096,
                "blockSize": 32,
                "gpuMemoryUtilization": 0.85,
                "enablePrefixCaching": False,
                "dtype": "bfloat16",
                "extraArgs": ["--max-queue-len", "100"],
            },
        }
    )["args"]
    assert args[1] == "hf://meta-llama/Llama-3.1-8B-Instruct"
    assert flag(args, "--revision") == "main"
    assert flag(args, "--served-model-name") == "llama"
    assert flag(args, "--max-model-len") == "8192"
    assert flag(args, "--max-num-seqs") == "64"
    assert flag(args, "--max-num-batched-tokens") == "4096"
    assert flag(args, "--block-size") == "32"
    assert flag(args, "--gpu-memory-utilization") == "0.85"
    assert flag(args, "--dtype") == "bfloat16"
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args
    assert args[-2:] == ["--max-queue-len", "100"]  # extra args last, as given
    assert "--device" not in args


def test_gpu_count_defaults_to_tensor_parallel_size_and_shm_is_mounted():
    spec = deployment(isvc({"engine": {"tensorParallelSize": 2}}), IMAGE)["spec"]["template"][
        "spec"
    ]
    c = spec["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert c["resources"]["requests"] == {"nvidia.com/gpu": "2"}
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert flag(c["args"], "--tensor-parallel-size") == "2"


def test_single_gpu_has_no_shm_volume_and_custom_gpu_resource():
    spec = deployment(isvc({"resources": {"gpu": 1, "gpuResourceName": "amd.com/gpu"}}), IMAGE)[
        "spec"
    ]["template"]["spec"]
    assert all(v["name"] != "shm" for v in spec["volumes"])
    assert spec["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "1"}


def test_probes_startup_budget_and_drain():
    spec = deployment(
        isvc(
            {
                "startup": {"timeoutSeconds": 3600},
                "drain": {"preStopSeconds": 20, "terminationGracePeriodSeconds": 120},
            }
        ),
        IMAGE,
    )["spec"]["template"]["spec"]
    c = spec["containers"][0]
    startup = c["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] == 3600
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    liveness = c["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60  # lenient
    assert c["lifecycle"]["preStop"] == {"sleep": {"seconds": 20}}
    assert spec["terminationGracePeriodSeconds"] == 120
    # The server's own drain ends before the kubelet's SIGKILL: 120 - 20 - 5.
    assert flag(c["args"], "--shutdown-timeout") == "95"
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_hardened_security_and_scrape_annotations():
    dep = deployment(isvc(), IMAGE)
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False, "the server needs no API token"
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/cache", "/tmp"} <= mounts  # writable places on a read-only root
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["OCTAVO_CACHE"] == "/cache"


def test_rollout_defaults_never_need_a_spare_gpu():
    dep = deployment(isvc(), IMAGE)
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    recreate = deployment(isvc({"rollout": {"strategy": "Recreate"}}), IMAGE)
    assert recreate["spec"]["strategy"] == {"type": "Recreate"}
    surge = deployment(isvc({"rollout": {"maxSurge": "25%", "maxUnavailable": 0}}), IMAGE)
    assert surge["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": 0}


def test_model_from_a_claim_is_mounted_read_only():
    spec = deployment(isvc({"model": {"uri": "pvc://weights/llama/8b"}}), IMAGE)["spec"][
        "template"
    ]["spec"]
    c = spec["containers"][0]
    assert c["args"][1] == "/models/weights/llama/8b"
    volume = next(v for v in spec["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models/weights", "readOnly": True}


def test_file_uri_and_cache_claims():
    spec = deployment(
        isvc({"model": {"uri": "file:///opt/models/qwen"}, "cache": {"claimName": "shared-cache"}}),
        IMAGE,
    )["spec"]["template"]["spec"]
    assert spec["containers"][0]["args"][1] == "/opt/models/qwen"
    cache = next(v for v in spec["volumes"] if v["name"] == "cache")
    assert cache["persistentVolumeClaim"] == {"claimName": "shared-cache"}
    made = deployment(isvc({"cache": {"size": "40Gi"}}), IMAGE)["spec"]["template"]["spec"]
    cache = next(v for v in made["volumes"] if v["name"] == "cache")
    assert cache["persistentVolumeClaim"] == {"claimName": "chat-cache"}
    plain = deployment(isvc(), IMAGE)["spec"]["template"]["spec"]
    assert next(v for v in plain["volumes"] if v["name"] == "cache") == {
        "name": "cache",
        "emptyDir": {},
    }


def test_scheduling_env_and_api_key():
    spec = deployment(
        isvc(
            {
                "nodeSelector": {"gpu": "h100"},
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ],
                "priorityClassName": "inference",
                "runtimeClassName": "nvidia",
                "env": [
                    {"name": "NCCL_DEBUG", "value": "INFO"},
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}},
                ],
                "apiKeySecretRef": {"name": "keys"},
            }
        ),
        IMAGE,
    )["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["priorityClassName"] == "inference" and spec["runtimeClassName"] == "nvidia"
    env = spec["containers"][0]["env"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in env
    hf_token = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}
    assert env[-2:] == [{"name": "NCCL_DEBUG", "value": "INFO"}, hf_token]
    key = next(e for e in env if e["name"] == "OCTAVO_API_KEY")
    assert key["valueFrom"] == {"secretKeyRef": {"name": "keys", "key": "api-key"}}


def test_replicas_follow_autoscaling_range():
    assert deployment(isvc({"replicas": 3}), IMAGE)["spec"]["replicas"] == 3
    assert deployment(isvc({"replicas": 0}), IMAGE)["spec"]["replicas"] == 0
    scaled = {"autoscaling": {"minReplicas": 2, "maxReplicas": 4}}
    assert deployment(isvc(scaled), IMAGE)["spec"]["replicas"] == 2
    assert deployment(isvc({**scaled, "replicas": 9}), IMAGE)["spec"]["replicas"] == 4
    assert deployment(isvc({**scaled, "replicas": 3}), IMAGE)["spec"]["replicas"] == 3
