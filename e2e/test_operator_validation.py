"""Specs the apiserver itself refuses, each with a message that says what is wrong."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from e2e import isvc

EXTRA_ARGS_REFUSED = (
    "must not set --host, --port, --served-model-name, --api-key, nor an abbreviation of one"
)
NODE_ARGS_REFUSED = "must not set --nnodes, --node-rank, --master-addr, --master-port, --headless"
INVERTED_LOOKUP = {
    "method": "ngram",
    "num_speculative_tokens": 2,
    "prompt_lookup_min": 5,
    "prompt_lookup_max": 2,
}
INVALID = {
    "max-below-min": (
        {"autoscaling": {"minReplicas": 4, "maxReplicas": 2}},
        "maxReplicas must be >= autoscaling.minReplicas",
    ),
    "surge-and-unavailable-zero": (
        {"rollout": {"maxSurge": 0, "maxUnavailable": "0%"}},
        "must not both be zero",
    ),
    "tensor-parallel-above-gpus": (
        {"engine": {"tensorParallelSize": 4}, "resources": {"gpu": 2}},
        "must not exceed resources.gpu",
    ),
    "tensor-times-pipeline-above-gpus": (
        {"engine": {"tensorParallelSize": 2, "pipelineParallelSize": 2}, "resources": {"gpu": 2}},
        "must not exceed resources.gpu",
    ),
    "pipeline-parallel-zero": ({"engine": {"pipelineParallelSize": 0}}, "pipelineParallelSize"),
    "unknown-quantization": ({"engine": {"quantization": "int4"}}, "Unsupported value"),
    "speculation-unknown-method": (
        {"engine": {"speculativeConfig": {"method": "eagle", "num_speculative_tokens": 2}}},
        "Unsupported value",
    ),
    "speculation-zero-tokens": (
        {"engine": {"speculativeConfig": {"method": "ngram", "num_speculative_tokens": 0}}},
        "num_speculative_tokens",
    ),
    "speculation-draft-without-model": (
        {"engine": {"speculativeConfig": {"method": "draft_model", "num_speculative_tokens": 2}}},
        "method draft_model needs a model",
    ),
    "speculation-lookup-inverted": (
        {"engine": {"speculativeConfig": INVERTED_LOOKUP}},
        "prompt_lookup_min must not exceed prompt_lookup_max",
    ),
    "block-size": ({"engine": {"blockSize": 12}}, "blockSize must be 8, 16, 32, 64, 128 or 256"),
    "flash-attention-small-blocks": (
        {"engine": {"attentionBackend": "FLASH_ATTN"}},
        "FLASH_ATTN needs engine.blockSize 256",
    ),
    "gpu-memory-zero": ({"engine": {"gpuMemoryUtilization": 0}}, "must be in (0, 1]"),
    "gpu-memory-above-one": ({"engine": {"gpuMemoryUtilization": 1.5}}, "must be in (0, 1]"),
    "bad-uri-scheme": ({"model": {"uri": "s3://bucket/model"}}, "spec.model.uri"),
    "hf-uri-without-name": ({"model": {"uri": "hf://just-org"}}, "spec.model.uri"),
    "adapter-bad-uri": ({"adapters": [{"name": "a", "uri": "s3://b/a"}]}, "spec.adapters[0].uri"),
    "adapter-twice": (
        {"adapters": [{"name": "a", "uri": "hf://o/a"}, {"name": "a", "uri": "hf://o/b"}]},
        "Duplicate value",
    ),
    "adapter-without-uri": ({"adapters": [{"name": "a"}]}, "spec.adapters[0].uri"),
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
        EXTRA_ARGS_REFUSED,
    ),
    # argparse expands unique prefixes: each of these would reach the server as the full flag.
    "extra-args-abbreviated-host": ({"engine": {"extraArgs": ["--hos", "0"]}}, EXTRA_ARGS_REFUSED),
    "extra-args-abbreviated-port": ({"engine": {"extraArgs": ["--po", "1"]}}, EXTRA_ARGS_REFUSED),
    "extra-args-abbreviated-name": (
        {"engine": {"extraArgs": ["--served", "evil"]}},
        EXTRA_ARGS_REFUSED,
    ),
    "extra-args-api-key": (
        {"engine": {"extraArgs": ["--api-key", "plaintext"]}},
        EXTRA_ARGS_REFUSED,
    ),
    "extra-args-abbreviated-key-with-value": (
        {"engine": {"extraArgs": ["--api-k=plaintext"]}},
        EXTRA_ARGS_REFUSED,
    ),
    "extra-args-port-with-value": ({"engine": {"extraArgs": ["--port=1"]}}, EXTRA_ARGS_REFUSED),
    # the server reads vLLM's underscores as dashes (--api_key is --api-key)
    "extra-args-key-in-underscores": (
        {"engine": {"extraArgs": ["--api_key=plaintext"]}},
        EXTRA_ARGS_REFUSED,
    ),
    "extra-args-name-in-underscores": (
        {"engine": {"extraArgs": ["--served_model", "evil"]}},
        EXTRA_ARGS_REFUSED,
    ),
    "env-api-key-in-plain-text": (
        {"env": [{"name": "OCTAVO_API_KEY", "value": "plaintext"}]},
        "OCTAVO_API_KEY must not be a plain value",
    ),
    "env-value-and-value-from": (
        {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
        "takes value or valueFrom, not both",
    ),
    "env-two-sources": (
        {
            "env": [
                {
                    "name": "A",
                    "valueFrom": {
                        "fieldRef": {"fieldPath": "metadata.name"},
                        "secretKeyRef": {"name": "s", "key": "k"},
                    },
                }
            ]
        },
        "needs exactly one of secretKeyRef",
    ),
    "env-bad-name": ({"env": [{"name": "A=B", "value": "1"}]}, "spec.env[0].name"),
    "env-secret-without-key": (
        {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
        "spec.env[0].valueFrom.secretKeyRef.key: Required value",
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
    "nodes-gpus-do-not-cover-ranks": (
        {
            "engine": {"nodes": 2, "tensorParallelSize": 2, "pipelineParallelSize": 2},
            "resources": {"gpu": 4},
        },
        "resources.gpu × engine.nodes must equal",
    ),
    "nodes-do-not-divide-ranks": (
        {"engine": {"nodes": 2, "tensorParallelSize": 3}, "resources": {"gpu": 0}},
        "engine.nodes must divide",
    ),
    "nodes-cache-read-write-once": (
        {"engine": {"nodes": 2, "pipelineParallelSize": 2}, "cache": {"size": "10Gi"}},
        "needs cache.accessMode ReadWriteMany",
    ),
    "nodes-zero": ({"engine": {"nodes": 0}}, "spec.engine.nodes"),
    "extra-args-nnodes": ({"engine": {"extraArgs": ["--nnodes", "2"]}}, NODE_ARGS_REFUSED),
    "extra-args-headless": ({"engine": {"extraArgs": ["--headless"]}}, NODE_ARGS_REFUSED),
    "extra-args-abbreviated-master-addr": (
        {"engine": {"extraArgs": ["--master-a=x"]}},
        NODE_ARGS_REFUSED,
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


# Layouts the engine runs for some model (SmolLM2's 9 heads over 3 ranks; ranks as
# processes on CPU): the CRD refuses only what the engine refuses for every model.
ACCEPTED_LAYOUTS = {
    "tensor-parallel-3": {"engine": {"tensorParallelSize": 3}, "resources": {"gpu": 3}},
    "tensor-parallel-3-on-4-gpus": {"engine": {"tensorParallelSize": 3}, "resources": {"gpu": 4}},
    "tensor-3-pipeline-3": {
        "engine": {"tensorParallelSize": 3, "pipelineParallelSize": 3},
        "resources": {"gpu": 9},
    },
    "tensor-parallel-6": {"engine": {"tensorParallelSize": 6}, "resources": {"gpu": 8}},
    "tensor-parallel-on-cpu": {"engine": {"tensorParallelSize": 2}, "resources": {"gpu": 0}},
    "pipeline-parallel-on-cpu": {"engine": {"pipelineParallelSize": 3}, "resources": {"gpu": 0}},
    "two-nodes-tensor-2-pipeline-2": {
        "engine": {"nodes": 2, "tensorParallelSize": 2, "pipelineParallelSize": 2},
        "resources": {"gpu": 2},
    },
    "two-nodes-tensor-across": {
        "engine": {"nodes": 2, "tensorParallelSize": 2},
        "resources": {"gpu": 1},
    },
    "two-nodes-pipeline-on-cpu": {
        "engine": {"nodes": 2, "pipelineParallelSize": 2},
        "resources": {"gpu": 0},
    },
    "flash-attention-in-pages-of-256": {
        "engine": {"attentionBackend": "FLASH_ATTN", "blockSize": 256},
        "resources": {"gpu": 1},
    },
}


@pytest.mark.parametrize("case", sorted(ACCEPTED_LAYOUTS))
def test_layouts_the_engine_runs_are_accepted(namespace, custom, operator, case):
    spec = ACCEPTED_LAYOUTS[case]
    created = custom.create_namespaced_custom_object(
        isvc.GROUP,
        isvc.VERSION,
        namespace,
        isvc.PLURAL,
        isvc.manifest("layout", spec),
        dry_run="All",
    )
    for field, value in spec["engine"].items():
        assert created["spec"]["engine"][field] == value


ALLOWED_EXTRA_ARGS = [
    "--max-num-seqs=4",
    "--log-level",
    "debug",
    "--enforce-eager",
    "--node-join-timeout",
    "900",
    "-O0",
    "--max_num_batched_tokens=512",
    "-cc.cudagraph_mode=NONE",
]


def test_other_extra_args_and_typed_env_are_accepted(namespace, custom, operator):
    spec = {
        "engine": {"extraArgs": ALLOWED_EXTRA_ARGS},
        "env": [
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}},
        ],
    }
    created = custom.create_namespaced_custom_object(
        isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, isvc.manifest("ok", spec), dry_run="All"
    )
    assert created["spec"]["engine"]["extraArgs"] == ALLOWED_EXTRA_ARGS
    assert created["spec"]["env"] == spec["env"]


def test_speculative_config_reaches_the_server_as_json(namespace, custom, operator):
    speculative = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    body = isvc.manifest("spec", {"engine": {"speculativeConfig": speculative}})
    created = custom.create_namespaced_custom_object(
        isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, body, dry_run="All"
    )
    assert created["spec"]["engine"]["speculativeConfig"] == speculative


def test_bad_name_is_refused(namespace, custom, operator):
    body = isvc.manifest("9-starts-with-a-digit")
    with pytest.raises(client.ApiException) as refused:
        isvc.create(custom, namespace, body)
    assert "must be a DNS label" in json.loads(refused.value.body)["message"]


def test_a_multi_node_name_too_long_for_its_group_is_refused(namespace, custom, operator):
    spec = {"engine": {"nodes": 2, "pipelineParallelSize": 2}, "resources": {"gpu": 0}}
    body = isvc.manifest("a" * 45, spec)
    with pytest.raises(client.ApiException) as refused:
        isvc.create(custom, namespace, body)
    assert (
        "metadata.name must be at most 44 characters" in json.loads(refused.value.body)["message"]
    )


def test_defaults_are_filled_by_the_apiserver(namespace, custom, operator):
    created = custom.create_namespaced_custom_object(
        isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, isvc.manifest("defaults"), dry_run="All"
    )
    spec = created["spec"]
    assert spec["engine"]["blockSize"] == 16 and spec["engine"]["tensorParallelSize"] == 1
    assert spec["rollout"] == {"strategy": "RollingUpdate", "maxSurge": 0, "maxUnavailable": 1}
    assert spec["drain"] == {"preStopSeconds": 10, "terminationGracePeriodSeconds": 60}
    assert spec["replicas"] == 1, "defaulted: /scale starts the autoscaler from it"
