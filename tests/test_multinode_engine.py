"""The engine across "hosts", led from this process: ``LLM(..., nnodes=2)`` is node 0 (its
engine core drives every rank) and a real ``octavo serve --headless`` process on
127.0.0.1 is node 1.

Tensor parallel 2 across the two nodes (each host holds half of every layer, so the
all-reduce crosses hosts over gloo) and pipeline parallel 2 across them (the sampling
driver is on the worker host): greedy fp32 output token-identical to one process, and
the leader's clean stop lets the worker host exit 0. A worker host started with other
parallel sizes is refused, and the leader's load fails, both with one clear message.
(The served leader, its /health and exit codes are in test_multinode_serving.py.)
"""

from __future__ import annotations

import re

import pytest

from octavo import LLM, SamplingParams
from octavo.executor.node_channel import KEY_ENV, NodeRefused

from greedy_prompts import mixed_prompts
from multinode_cluster import NODE_KEY, SMALL_ENGINE_FLAGS, NodeGroup

JOIN_SECONDS = 240.0
EXIT_WITHIN_SECONDS = 60
MAX_TOKENS = 12
ENGINE = {"dtype": "float32", "max_model_len": 384, "kv_cache_memory": 8 << 20}
WORKER_FLAGS = [*SMALL_ENGINE_FLAGS, "--node-join-timeout", "240"]


@pytest.fixture(scope="module")
def prompts(smol_tokenizer) -> list[list[int]]:
    return mixed_prompts(smol_tokenizer)[:4]


@pytest.fixture(scope="module")
def expected(tiny_folder, prompts) -> list[list[int]]:
    """One process's greedy output."""
    with LLM(str(tiny_folder("llama3")), **ENGINE) as llm:
        return greedy(llm, prompts)


@pytest.fixture
def node_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, NODE_KEY)


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def sizes(tensor: int, pipeline: int) -> list[str]:
    return [
        "--tensor-parallel-size",
        str(tensor),
        "--pipeline-parallel-size",
        str(pipeline),
        "--nnodes",
        "2",
    ]


@pytest.mark.parametrize(("tensor", "pipeline"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_two_hosts_match_one_process_and_stop_cleanly(
    tiny_folder, tmp_path, node_key, prompts, expected, tensor, pipeline
):
    folder = tiny_folder("llama3")
    group = NodeGroup(folder, tmp_path, [*WORKER_FLAGS, *sizes(tensor, pipeline)])
    try:
        worker = group.start_worker(1)
        llm = LLM(
            str(folder),
            tensor_parallel_size=tensor,
            pipeline_parallel_size=pipeline,
            nnodes=2,
            master_port=group.master_port,
            node_join_timeout=JOIN_SECONDS,
            **ENGINE,
        )
        with llm:
            executor = llm.engine.executor
            assert [w.rank for w in executor.workers] == [0, 1]
            assert len(executor.local_workers) == 1 and len(executor.links) == 1
            assert greedy(llm, prompts) == expected
        assert worker.wait(EXIT_WITHIN_SECONDS) == 0, group.logs()
        assert "the leader stopped the engine" in worker.text()
    finally:
        group.stop_all()


def test_a_worker_host_with_other_parallel_sizes_is_refused(tiny_folder, tmp_path, node_key):
    folder = tiny_folder("llama3")
    group = NodeGroup(folder, tmp_path, [*WORKER_FLAGS, *sizes(1, 2)])
    message = (
        "node 1 (127.0.0.1) was started with --tensor-parallel-size 1, the leader with "
        "--tensor-parallel-size 2"
    )
    try:
        worker = group.start_worker(1)
        with pytest.raises(NodeRefused, match=re.escape(message)):
            LLM(
                str(folder),
                tensor_parallel_size=2,
                nnodes=2,
                master_port=group.master_port,
                node_join_timeout=JOIN_SECONDS,
                **ENGINE,
            )
        assert worker.wait(EXIT_WITHIN_SECONDS) == 1, group.logs()
        assert f"the leader refused this host: {message}" in worker.text()
    finally:
        group.stop_all()
