"""Specs the apiserver itself refuses, each with a message that says what is wrong."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from e2e import isvc

INVALID = {
    "replicas-and-autoscaling": (
        {"replicas": 2, "autoscaling": {"maxReplicas": 3}},
        "replicas and autoscaling are exclusive",
    ),
    "max-below-min": (
        {"autoscaling": {"minReplicas": 4, "maxReplicas": 2}},
        "maxReplicas must be >= autoscaling.minReplicas",
    ),
    "surge-and-unavailable-zero": (
        {"rollout": {"maxSurge": 0, "maxUnavailable": "0%"}},
        "must not both be zero",
    ),
    "tensor-parallel-not-power-of-two": (
        {"engine": {"tensorParallelSize": 3}, "resources": {"gpu": 4}},
        "must be a power of two",
    ),
    "tensor-parallel-above-gpus": (
        {"engine": {"tensorParallelSize": 4}, "resources": {"gpu": 2}},
        "must not exceed resources.gpu",
    ),
    "block-size": ({"engine": {"blockSize": 12}}, "blockSize must be 8, 16 or 32"),
    "gpu-memory-zero": ({"engine": {"gpuMemoryUtilization": 0}}, "must be in (0, 1]"),
    "gpu-memory-above-one": ({"engine": {"gpuMemoryUtilization": 1.5}}, "must be in (0, 1]"),
    "bad-uri-scheme": ({"model": {"uri": "s3://bucket/model"}}, "spec.model.uri"),
    "hf-uri-without-name": ({"model": {"uri": "hf://just-org"}}, "spec.model.uri"),
    "revision-without-hf": (
        {"model": {"uri": "file:///models/x", "revision": "main"}},
        "revision applies only to an hf://",
    ),
    "cache-both": (
        {"cache": {"claimName": "weights", "size": "10Gi"}},
        "exactly one of claimName",
    ),
    "budget-both": (
        {"disruptionBudget": {"maxUnavailable": 1, "minAvailable": 1}},
        "exactly one of maxUnavailable or minAvailable",
    ),
    "drain-grace-too-short": (
        {"drain": {"preStopSeconds": 30, "terminationGracePeriodSeconds": 20}},
        "must exceed drain.preStopSeconds",
    ),
    "extra-args-override-port": (
        {"engine": {"extraArgs": ["--port", "9000"]}},
        "must not set --host, --port, --served-model-name",
    ),
    "kv-target-above-one": (
        {"autoscaling": {"maxReplicas": 2, "metric": "kvCacheUsage", "target": 2}},
        "fraction in (0, 1]",
    ),
    "unknown-metric": (
        {"autoscaling": {"maxReplicas": 2, "metric": "gpuTemperature"}},
        "Unsupported value",
    ),
    "negative-replicas": ({"replicas": -1}, "spec.replicas"),
    "cpu-with-tensor-parallel": (
        {"engine": {"tensorParallelSize": 2}, "resources": {"gpu": 0}},
        "must be 1 on CPU",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_spec_is_refused(cluster, namespace, custom, operator, case):
    spec, expected = INVALID[case]
    body = isvc.manifest("bad", spec)
    with pytest.raises(client.ApiException) as refused:
        custom.create_namespaced_custom_object(
            isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, body, dry_run="All"
        )
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert expected in message, message


def test_bad_name_is_refused(namespace, custom, operator):
    body = isvc.manifest("9-starts-with-a-digit")
    with pytest.raises(client.ApiException) as refused:
        isvc.create(custom, namespace, body)
    assert "must be a DNS label" in json.loads(refused.value.body)["message"]


def test_defaults_are_filled_by_the_apiserver(namespace, custom, operator):
    created = custom.create_namespaced_custom_object(
        isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, isvc.manifest("defaults"), dry_run="All"
    )
    spec = created["spec"]
    assert spec["engine"]["blockSize"] == 16 and spec["engine"]["tensorParallelSize"] == 1
    assert spec["rollout"] == {"strategy": "RollingUpdate", "maxSurge": 0, "maxUnavailable": 1}
    assert spec["drain"] == {"preStopSeconds": 10, "terminationGracePeriodSeconds": 60}
    assert "replicas" not in spec
