"""PodProcess's stand-ins for what a cluster gives a pod (no cluster needed): env values that
replace the container's own (and its $(VAR) expansions), argument overrides, and a `--port`
that no containerPort names (a headless node's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.pod_process import PodProcess


def worker_pod() -> dict:
    container = {
        "name": "server",
        "command": ["octavo"],
        "args": [
            "serve",
            "m",
            "--port",
            "8000",
            "--master-addr",
            "$(LWS_LEADER_ADDRESS)",
            "--master-port=29501",
            "--headless",
        ],
        "env": [{"name": "LWS_LEADER_ADDRESS", "value": "multi-lws-0.multi-lws.ns"}],
    }
    return {"metadata": {"name": "multi-lws-0-1"}, "spec": {"containers": [container]}}


def test_env_and_arg_overrides_reach_the_command_and_its_environment(tmp_path: Path):
    pod = PodProcess(worker_pod(), tmp_path, pod_ip="127.9.8.7")
    pod.env_overrides["LWS_LEADER_ADDRESS"] = "127.1.2.3"
    pod.arg_overrides["--master-port"] = "40001"
    argv = pod.argv()
    assert argv[argv.index("--master-addr") + 1] == "127.1.2.3"
    assert "--master-port=40001" in argv
    assert argv[argv.index("--port") + 1] == "8000"  # on the pod's own loopback IP
    assert pod.environment({})["LWS_LEADER_ADDRESS"] == "127.1.2.3"


def test_a_port_without_a_container_port_maps_to_a_free_one(tmp_path: Path):
    pod = PodProcess(worker_pod(), tmp_path)
    argv = pod.argv()
    local = int(argv[argv.index("--port") + 1])
    assert local != 8000 and pod.local_port(8000) == local


def test_an_override_of_a_flag_the_pod_lacks_is_refused(tmp_path: Path):
    pod = PodProcess(worker_pod(), tmp_path)
    pod.arg_overrides["--node-rank"] = "1"
    with pytest.raises(AssertionError, match="--node-rank"):
        pod.argv()


def test_pods_get_a_small_kv_cache_unless_their_spec_sets_one(tmp_path: Path):
    """The pods share the test machine: 128 MiB of KV each, not the CPU default of 2 GiB,
    and CPU graphs recorded at first use."""
    pod = PodProcess(worker_pod(), tmp_path)
    assert pod.environment({})["OCTAVO_KV_CACHE_MEMORY"] == "128MiB"
    assert pod.environment({})["OCTAVO_CPU_GRAPHS"] == "first-use"
    spec = worker_pod()
    spec["spec"]["containers"][0]["env"].append({"name": "OCTAVO_KV_CACHE_MEMORY", "value": "1GiB"})
    assert PodProcess(spec, tmp_path).environment({})["OCTAVO_KV_CACHE_MEMORY"] == "1GiB"
