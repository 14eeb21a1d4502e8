"""The CRD refuses only the tensor/pipeline layouts the engine refuses for every model.

The engine's layout checks (octavo.distributed.parallel_config) are the truth: a size is
refused for a model whose heads, intermediate size or vocabulary do not divide by it, which
says nothing about other models. SmolLM2 (9 heads, 3 KV heads) runs at tensor-parallel 3.
So the CRD may bound the sizes (1..64, as it bounds resources.gpu) and ask one GPU per rank
when it runs on GPUs, and nothing else. (The apiserver's own verdict on TP 3, with its CEL
rules evaluated, is in e2e/test_operator_validation.py.)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from octavo.distributed.parallel_config import ParallelConfig
from octavo_operator.api.crd import custom_resource_definition

LAYOUT_FIELDS = ("tensorParallelSize", "pipelineParallelSize")
GPU_RULE_START = "!has(self.resources.gpu) || self.resources.gpu == 0 || "


def spec_schema() -> dict[str, Any]:
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root["properties"]["spec"]


def rules_naming(field: str, node: object) -> list[str]:
    """The CEL rules anywhere below NODE that mention FIELD."""
    if isinstance(node, list):
        return [r for item in node for r in rules_naming(field, item)]
    if not isinstance(node, dict):
        return []
    own = [v["rule"] for v in node.get("x-kubernetes-validations", []) if field in v["rule"]]
    return own + [r for value in node.values() for r in rules_naming(field, value)]


def a_model_for(size: int) -> SimpleNamespace:
    """A model config every dimension of which divides by SIZE (one KV head: replicated)."""
    return SimpleNamespace(
        num_heads=size,
        intermediate_size=8 * size,
        vocab_size=64 * size,
        num_kv_heads=1,
        num_layers=size,
    )


def test_tensor_parallel_three_and_every_other_size_the_engine_runs_are_in_range() -> None:
    engine = spec_schema()["properties"]["engine"]["properties"]
    for field in LAYOUT_FIELDS:
        schema = engine[field]
        assert "enum" not in schema, f"engine.{field}: any size some model splits over"
        assert schema["minimum"] == 1 and schema["maximum"] >= 64
        for size in range(1, schema["maximum"] + 1):
            tensor = field == "tensorParallelSize"
            layout = ParallelConfig(size, 1) if tensor else ParallelConfig(1, size)
            assert layout.problems(a_model_for(size), torch.device("cpu")) == [], (field, size)
    smollm2 = SimpleNamespace(
        num_heads=9, intermediate_size=1536, vocab_size=49152, num_kv_heads=3, num_layers=30
    )
    assert ParallelConfig(3, 1).problems(smollm2, torch.device("cpu")) == []


def test_the_only_layout_rules_are_one_gpu_per_rank_and_an_even_split_over_nodes() -> None:
    """No rule restricts the sizes' values (the old `in [1, 2, 4, ...]` refused TP 3), and
    CPU replicas (resources.gpu 0) may run ranks as processes, as the engine does (gloo).
    With engine.nodes > 1 each pod holds the same number of ranks (nodes divides the world)
    and, on GPUs, one GPU per rank: resources.gpu × nodes = tensor × pipeline."""
    schema = spec_schema()
    for field in LAYOUT_FIELDS:
        one_replica, per_node, split = rules_naming(field, schema)
        assert one_replica.startswith(GPU_RULE_START), one_replica
        assert one_replica.endswith("<= self.resources.gpu"), one_replica
        assert "self.engine.nodes > 1 ||" in one_replica, "one pod: the old rule, unchanged"
        assert per_node.startswith(GPU_RULE_START), per_node
        assert per_node.endswith(
            "self.resources.gpu * self.engine.nodes == "
            "self.engine.tensorParallelSize * self.engine.pipelineParallelSize"
        ), per_node
        assert split.endswith("% self.nodes == 0"), split
